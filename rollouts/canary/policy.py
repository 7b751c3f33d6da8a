"""How an analysis step ends, as pure functions over samples and a config: which requests are
evidence (every analysis step of the attempt so far, each less its warm-up after the weight
change) and what a look's judgement means for the step (go on, go back, wait, or ask a person).
:func:`rollouts.canary.analysis.look` applies it to the database rows; ``bench/judge.py`` to
simulated rollouts, so both run the same decision.

An analysis step ends:

* ``fail`` the moment the judge shows a metric beyond its tolerance (or a gate beyond its
  ceiling), whatever the step;
* ``pass`` once the step has seen ``min_samples`` canary requests at its weight and either the
  judge shows every metric within its tolerance (the canary is at most that much worse), or,
  for an analysis step that is not the rollout's last, nothing is shown beyond a tolerance (the
  weight goes up while no harm is shown; the proof is left to the last analysis step, on
  all the evidence gathered by then);
* ``inconclusive`` (a person decides) when the attempt's canary requests reach
  ``planned_samples`` or ``timeout_s`` passes without either;
* otherwise it keeps looking.

The evidence is cumulative across the steps of an attempt so that the error budget is spent once
for the whole rollout (the bounds are valid at every look, however many steps look), and so
that a version proven at 25% need not be proven again from scratch at 50%.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.canary.judge import FAIL, INCONCLUSIVE, PASS, Judgement

RUNNING = "running"


@dataclass(frozen=True)
class StepWindow:
    """An analysis step's stretch of time: from ``start`` (when its weight took effect) to
    ``end`` (None while it runs); its first ``warmup_s`` seconds are not evidence."""

    start: float
    end: float | None
    warmup_s: float

    def holds(self, t: float) -> bool:
        return t >= self.start + self.warmup_s and (self.end is None or t < self.end)


def evidence(samples: Iterable[Any], windows: Sequence[StepWindow]) -> list[Any]:
    """The samples (anything with a finish time ``t``) inside one of the windows, past its
    warm-up."""
    return [s for s in samples if any(w.holds(s.t) for w in windows)]


def step_end(judgement: Judgement, *, step_samples: int, min_samples: int, last: bool,
             planned_samples: int, elapsed_s: float, timeout_s: float) -> tuple[str, str]:
    """What a look means for the analysis step: (``pass``/``fail``/``inconclusive``/
    ``running``, why in one line; the judgement's reasons give the numbers). ``step_samples``: canary requests at this step's weight (past the
    warm-up); ``judgement.canary_samples``: those of every step so far."""
    if judgement.verdict == FAIL:
        return FAIL, "a regression is shown beyond what is allowed"
    seen = step_samples >= min_samples
    if seen and judgement.within:
        return PASS, (f"{judgement.canary_samples} canary requests show it within every "
                      "tolerance")
    if seen and not last:
        return PASS, (f"{step_samples} canary requests at this weight show no regression; "
                      "the last analysis step is to show it within the tolerances")
    if judgement.canary_samples >= planned_samples:
        return INCONCLUSIVE, (f"{judgement.canary_samples} of {planned_samples} planned canary "
                              "requests, and the bounds do not settle it")
    if elapsed_s >= timeout_s:
        return INCONCLUSIVE, (f"{elapsed_s:.0f} s passed without a verdict (timeout "
                              f"{timeout_s:g} s)")
    if not seen:
        return RUNNING, f"{step_samples} of {min_samples} canary requests at this weight"
    return RUNNING, "not settled yet: looking again"
