"""The local app's tests share the loaded world of the rollouts tests (the demo's traffic runs
through a deployment's route)."""

from tests.rollouts.conftest import world  # noqa: F401
