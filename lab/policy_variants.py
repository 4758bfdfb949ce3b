"""Policy variants measured against the engine's DraftLengthPolicy, kept here so a replay or an A/B can run them
again (docs/policy.md "An optimistic α1 instead of a draw").

`OptimisticPolicy`: α1 weighed at its posterior mean plus z standard deviations instead of a draw from its
posterior, the spread widened over plain steps as if the counts had decayed through them (the mean unmoved).
Replayed it gains 0.4-2.6 % where drafting pays; it fails the stale-t(1) guard of tests/test_policy.py, so the
engine keeps the draw.
"""

from __future__ import annotations

from dflash_gguf.engine.cost import CostCurve, smoothed
from dflash_gguf.engine.policy import DraftLengthPolicy, SlotAcceptance


class OptimisticSlots(SlotAcceptance):
    """SlotAcceptance whose α1 "draw" is its optimistic estimate; `idle` counts the plain steps since an update."""
    z: float = 1.5

    def __post_init__(self):
        super().__post_init__()
        self.idle = 0

    def update(self, n_drafted: int, n_accepted: int) -> None:
        super().update(n_drafted, n_accepted)
        self.idle = 0

    def carried(self, weight: float | None = None) -> "OptimisticSlots":
        fresh = super().carried(weight)
        fresh.z = self.z
        return fresh

    def draw_first(self, rng) -> float:
        n = self.tried[0] + self.prior_weight
        mean = (self.accepted[0] + self.prior[0] * self.prior_weight) / n
        n *= self.decay ** self.idle
        return mean + self.z * (mean * (1.0 - mean) / (n + 1.0)) ** 0.5


class OptimisticPolicy(DraftLengthPolicy):
    def __init__(self, *args, z: float = 1.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.slots = OptimisticSlots(self.draft_max)
        self.slots.z = z

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float | None = None,
                draft_s: float | None = None, draft_n: int | None = None, lookup: bool = False) -> None:
        if n_drafted == 0 and not lookup:
            self.slots.idle += 1
        super().observe(n_drafted, n_accepted, verify_s, draft_s, draft_n, lookup)


class MeanOrDrawSlots(SlotAcceptance):
    """SlotAcceptance whose α1 "draw" is the larger of its posterior mean and a draw from the posterior."""

    def draw_first(self, rng) -> float:
        return max(self.alpha()[0], super().draw_first(rng))


class MeanOrDrawPolicy(DraftLengthPolicy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slots = MeanOrDrawSlots(self.draft_max)


class StreakCostCurve(CostCurve):
    """CostCurve whose verify timings lower t(1) through the calibrated shape only once `streak` draft steps ran
    since the last plain step (`since_plain`): between plain steps t(1) is timed directly."""
    streak: int = 8
    since_plain: int = 0

    def observe_verify(self, b: int, seconds: float, cold: bool = False) -> None:
        if self.since_plain >= self.streak:
            return super().observe_verify(b, seconds, cold)
        table = self.t_cold if cold and self.t_cold else self.t
        table[b] = smoothed(table.get(b), seconds, self.smoothing)
        self.version += 1


class StreakPolicy(DraftLengthPolicy):
    def __init__(self, *args, streak: int = 8, **kwargs):
        super().__init__(*args, **kwargs)
        self.cost.__class__ = StreakCostCurve
        self.cost.streak = streak
        self.cost.since_plain = 0

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float | None = None,
                draft_s: float | None = None, draft_n: int | None = None, lookup: bool = False) -> None:
        if not lookup:
            self.cost.since_plain = 0 if n_drafted == 0 else self.cost.since_plain + 1
        super().observe(n_drafted, n_accepted, verify_s, draft_s, draft_n, lookup)
