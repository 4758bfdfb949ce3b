"""The draft-source interface: what the loop drafts from, and what a draft is.

The loop calls, in order: `begin()` once per generation, `process(features, pos0)` after every
target decode with the features of the rows it keeps, and `draft(last, pos, n, want_logits, pick)` for a
block. `features` may be a view that the caller reuses after `process` returns: a source copies what it keeps.
At T > 0 in rejection mode the loop passes `pick(logits [V]) -> (token, q [V])`: a source whose later slots
depend on the tokens drawn earlier (DFlash2's selector walk, DSpark's Markov chain when the engine runs it) draws
with it and returns each q; the others return logits and the loop draws every slot itself. A source may also rate
its slots (`Proposal.confidence`), which the policy can use to verify fewer of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Proposal:
    tokens: list[int]                 # d1..dn
    logits: np.ndarray | None = None  # [n, V] drafter logits for d1..dn (needed for T>0), a copy
    q: np.ndarray | None = None       # [n, V] proposal distributions the tokens were drawn from (T>0)
    confidence: np.ndarray | None = None   # [n] the drafter's own estimate that each slot is accepted given the
                                           # slots before it were (DSpark's confidence head), when it has one

    def first(self, k: int) -> "Proposal":
        """The first k drafts (k <= n), with their logits, q and confidences."""
        if k >= len(self.tokens):
            return self
        cut = (lambda a: None if a is None else a[:k])
        return Proposal(self.tokens[:k], cut(self.logits), cut(self.q), cut(self.confidence))


class DraftSource:
    """A source implements `draft`; the defaults fit one that reads no target features."""

    member: str                       # which source this is: a DFlash family member, "lookup"
    block_size: int                   # max tokens per draft call, including the anchor slot
    taps: list[int] = []              # target layer ids whose features `process` expects
    rates_by_probability = False      # its slot ratings are its own softmax probabilities (calibrated by the
                                      # policy) rather than a head trained to predict acceptance

    def begin(self) -> None:
        pass

    def process(self, features: np.ndarray, pos0: int) -> None:
        pass

    def flush(self) -> int:           # inject what `process` held back now; returns how many rows that was
        return 0

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        raise NotImplementedError

    def rate_slots(self) -> bool:     # rate each draft's slots from now on (Proposal.confidence); False: cannot
        return False

    def pos_max(self) -> int | None:  # the last position it holds context for; None: it holds no positions
        return None
