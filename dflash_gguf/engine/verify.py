"""Verification of a drafted block: pure functions, no native state.

Terms (used the same way everywhere):
- accepted: the leading draft tokens the target agrees with (0..n).
- recovered: on the first rejection, the token drawn in place of the rejected draft token.
- bonus: when all n draft tokens are accepted, one more token drawn from the target's last row.
Every verify therefore emits accepted + 1 tokens (τ counts that one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sampling import sample


@dataclass(frozen=True)
class Verdict:
    n_accepted: int          # leading draft tokens kept
    next_token: int          # recovered or bonus token, emitted after the accepted ones

    def emitted(self, draft: list[int]) -> list[int]:
        return list(draft[:self.n_accepted]) + [self.next_token]


def verify_greedy(draft: list[int], target_argmax: np.ndarray) -> Verdict:
    """Greedy verification.

    draft: n proposed tokens d1..dn. target_argmax: [n+1] the target's argmax at rows
    [last, d1, ..., dn], i.e. its choice for the positions of d1..dn and the one after.
    Accept the longest prefix where d_i == argmax_{i-1}; the next token is the target's choice
    at the first disagreement (or the bonus after dn).
    """
    n = len(draft)
    assert target_argmax.shape[0] == n + 1, (target_argmax.shape, n)
    a = 0
    while a < n and draft[a] == int(target_argmax[a]):
        a += 1
    return Verdict(a, int(target_argmax[a]))


def verify_stochastic(draft: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): lossless for any q.

    draft: n tokens, d_i drawn from q[i-1]. q: [n, V] drafter distributions (after the sampling
    transform). p: [n+1, V] target distributions at rows [last, d1, ..., dn] (same transform).
    Accept d_i with probability min(1, p(d_i)/q(d_i)); on the first rejection draw the recovered
    token from norm(max(p - q, 0)); if all are accepted draw the bonus from p[n].
    """
    n = len(draft)
    assert q.shape[0] == n and p.shape[0] == n + 1, (q.shape, p.shape, n)
    for i, d in enumerate(draft):
        pi, qi = p[i, d], q[i, d]
        if qi > 0 and rng.random() * qi < pi:      # u < p/q without dividing
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        # total == 0 only when p == q exactly, where rejection has probability 0; guard anyway
        return Verdict(i, sample(residual / total if total > 0 else p[i], rng))
    return Verdict(n, sample(p[n], rng))


@dataclass
class SlotCounts:
    """Per-slot counts over verified blocks (slot k is the k-th draft token, 0-based): drafted when the block
    had more than k drafts, tried when the verifier reached it (every slot before it accepted), accepted when
    the target kept it. Float arrays, so that an online estimate can decay them; grown on demand."""
    drafted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tried: np.ndarray = field(default_factory=lambda: np.zeros(0))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def zeros(cls, n_slots: int) -> "SlotCounts":
        return cls(np.zeros(n_slots), np.zeros(n_slots), np.zeros(n_slots))

    def grow(self, n_slots: int) -> None:
        if len(self.drafted) < n_slots:
            more = n_slots - len(self.drafted)
            self.drafted, self.tried, self.accepted = (np.pad(a, (0, more))
                                                       for a in (self.drafted, self.tried, self.accepted))

    def record(self, n_drafted: int, n_accepted: int) -> None:
        """One verified block: slots 0..n_accepted-1 accepted, slot n_accepted (if drafted) rejected."""
        self.grow(n_drafted)
        self.drafted[:n_drafted] += 1
        self.tried[:min(n_accepted + 1, n_drafted)] += 1
        self.accepted[:n_accepted] += 1

    def scale(self, factor: float) -> None:
        for a in (self.drafted, self.tried, self.accepted):
            a *= factor

    def per_tried(self) -> list[float]:
        """P(slot k accepted | the verifier reached it): the per-slot α of the draft-length policy."""
        return [float(a / t) if t else 0.0 for a, t in zip(self.accepted, self.tried)]

    def per_drafted(self) -> list[float]:
        """P(slot k accepted | it was drafted): what `run` and `bench` report per slot."""
        return [float(a / d) if d else 0.0 for a, d in zip(self.accepted, self.drafted)]
