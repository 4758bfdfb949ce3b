"""Acceptance along a target-written span, counted the way a greedy speculative run meets it.

Averaging the accepted length over random anchors overweights easy stretches: a run of 40 predictable
tokens holds 40 anchors, but a decoding loop crosses it in a few blocks and spends its calls where the
drafter fails. Walking the span — draft at p, accept k, continue at p + k + 1 — counts what the engine
(and `measure.py`) counts, so validation τ and engine τ measure the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .verify import SlotCounts


def leading_correct(right: np.ndarray) -> np.ndarray:
    """[A, n] per-slot hits (False past the end of the span) -> [A] leading hits of each block."""
    return np.cumprod(right, axis=1).sum(axis=1)


@dataclass
class Walk:
    tokens: int = 0                                  # tokens after each span's first
    calls: int = 0                                   # blocks drafted (target calls)
    slots: SlotCounts = field(default_factory=SlotCounts)

    def add_span(self, runs: np.ndarray, n_slots: int) -> None:
        """runs[i]: leading hits of the block drafted at the span's (i)-th position, for every position but
        the last of the span (len(runs) = span length - 1)."""
        self.slots.grow(n_slots)
        p, end = 0, len(runs)
        while p < end:
            k = int(runs[p])
            self.block(k, min(n_slots, end - p))
            p += k + 1
        self.tokens += end

    def block(self, k: int, n: int) -> None:
        """One drafted block: k leading drafts accepted out of n that could have been (a call; the caller
        counts the tokens, since the last block of a span has no bonus token)."""
        self.slots.record(n, k)
        self.calls += 1

    @property
    def tau(self) -> float:
        return self.tokens / self.calls if self.calls else 1.0

    @property
    def slot_accept(self) -> list[float]:
        return self.slots.per_tried()
