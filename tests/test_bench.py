"""bench/loads.py runs end to end and reports sane numbers (a smoke test, not a speed goal)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_bench

KEYS = (
    "load_s_median",
    "load_warm_s_median",
    "bare_load_s_median",
    "unload_s_median",
    "bare_unload_s_median",
)


@pytest.mark.triton
def test_the_load_bench_runs_and_reports_positive_timings():
    result = run_bench("loads.py", "--runs", "1", leave_out=("DATABASE_URL",))
    for key in KEYS:
        assert isinstance(result.get(key), float) and result[key] > 0, (key, result.get(key))
    assert result["runs"] == 1
    # Switchyard does the bare calls and more: far below half of bare means it measured nothing.
    assert result["load_s_median"] >= result["bare_load_s_median"] * 0.5


def test_a_server_started_while_signals_wait_still_hears_sigterm_and_the_signal_is_acted_on():
    """bench/loads.py holds SIGINT/SIGTERM back while it starts a server and registers it for
    shutdown. The child must not inherit that: a server started deaf to SIGTERM made every
    stop wait out its timeout before SIGKILL. A signal that came meanwhile is acted on once
    the server is registered."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import loads

    previous = {sig: signal.signal(sig, loads.on_signal) for sig in loads.SIGNALS}
    child = None
    try:
        with pytest.raises(KeyboardInterrupt), loads.deferred_signals():
            child = subprocess.Popen(["sleep", "30"])
            os.kill(os.getpid(), signal.SIGTERM)  # noted, not acted on yet
            blocked = int(Path(f"/proc/{child.pid}/status").read_text()
                          .split("SigBlk:")[1].split()[0], 16)
        assert not blocked & (1 << (signal.SIGTERM - 1)), hex(blocked)
        child.terminate()
        assert child.wait(5) == -signal.SIGTERM
    finally:
        loads.STOP.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child is not None and child.poll() is None:
            child.kill()
