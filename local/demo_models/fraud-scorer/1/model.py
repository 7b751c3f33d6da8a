"""fraud-scorer version 1: the current production scorer.

Scores a feature vector ``INPUT0`` (FP32, any length) as ``SCORE = sigmoid(mean(INPUT0))``.
Latency and failures are simulated from the model config parameters: ``sleep_ms`` (or
``sleep_ms_v<version>``) milliseconds per request, and ``error_rate`` (or ``error_rate_v<version>``)
as the fraction of requests answered with an error. A late regression: ``late_sleep_ms`` (or
``late_sleep_ms_v<version>``) milliseconds per request from ``late_after_s`` seconds after the
model was loaded on.
"""

import json
import random
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config: dict, key: str, version: str, default: float) -> float:
    """Read ``<key>_v<version>`` or ``<key>`` from the config's string parameters."""
    params = config.get("parameters", {})
    for name in (f"{key}_v{version}", key):
        if name in params:
            return float(params[name]["string_value"])
    return default


class TritonPythonModel:
    """Mean-of-features fraud score with a configurable delay."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        version = args["model_version"]
        self.delay_s = _param(config, "sleep_ms", version, 0.0) / 1000.0
        self.error_rate = _param(config, "error_rate", version, 0.0)
        self.late_delay_s = _param(config, "late_sleep_ms", version, -1.0) / 1000.0
        self.late_at = time.monotonic() + _param(config, "late_after_s", version, 0.0)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            late = self.late_delay_s >= 0 and time.monotonic() >= self.late_at
            time.sleep(self.late_delay_s if late else self.delay_s)
            if self.error_rate and random.random() < self.error_rate:
                error = pb_utils.TritonError("simulated failure (error_rate)")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            features = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            mean = float(features.mean()) if features.size else 0.0
            score = np.array([1.0 / (1.0 + np.exp(-mean))], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORE", score)]))
        return responses
