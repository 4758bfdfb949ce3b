"""Verification of a drafted block: pure functions, no native state.

Terms (used the same way everywhere):
- accepted: the leading draft tokens the target agrees with (0..n).
- recovered: on the first rejection, the token drawn in place of the rejected draft token.
- bonus: when all n draft tokens are accepted, one more token drawn from the target's last row.
Every verify therefore emits accepted + 1 tokens (τ counts that one).
"""

from __future__ import annotations

from dataclasses import dataclass

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
