"""Policy variants measured against the engine's DraftLengthPolicy, kept here so a replay or an A/B can run them
again (docs/policy.md "An optimistic α1 instead of a draw").

`OptimisticPolicy`: α1 weighed at its posterior mean plus z standard deviations instead of a draw from its
posterior, the spread widened over plain steps as if the counts had decayed through them (the mean unmoved).
Replayed it gains 0.4-2.6 % where drafting pays; it fails the stale-t(1) guard of tests/test_policy.py, so the
engine keeps the draw.
"""

from __future__ import annotations

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
