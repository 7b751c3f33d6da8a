"""sentiment version 1: a tiny keyword-based sentiment classifier.

Reads one UTF-8 string ``TEXT`` and answers ``LABEL`` = "positive", "negative" or "neutral",
counting words from two small lists. No weights, no dependencies beyond numpy.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

POSITIVE = {"good", "great", "excellent", "love", "happy", "fast", "nice"}
NEGATIVE = {"bad", "terrible", "awful", "hate", "sad", "slow", "broken"}


def classify(text: str) -> str:
    """Label ``text`` by counting positive and negative words."""
    words = [w.strip(".,!?;:").lower() for w in text.split()]
    balance = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
    if balance > 0:
        return "positive"
    if balance < 0:
        return "negative"
    return "neutral"


class TritonPythonModel:
    """Keyword sentiment over a BYTES tensor."""

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            labels = [
                classify(t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t))
                for t in texts
            ]
            label = np.array([s.encode() for s in labels], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", label)]))
        return responses
