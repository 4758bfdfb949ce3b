"""A drafter's own probabilities as the chance that its slots are accepted, calibrated online.

A DFlash drafter's softmax already says where it is sure: on the shipped SmolLM2 drafter (Q4_K_M target, 3,183
slots of `../shared/prompts`) a slot-1 top probability ≥ 0.9 was accepted 89 % of the time, one below 0.3 7 %.
It is not a calibrated chance, and how far off it is depends on the text (training-like prompts: 96 % and 8 %),
so the policy maps it through acceptance rates counted per probability bin from the slots verified so far. The
map starts as the identity (each bin's prior is its centre) and follows the text with decaying counts.
"""

from __future__ import annotations

import numpy as np


def top_probabilities(logits: np.ndarray) -> np.ndarray:
    """[n] the largest softmax probability of each row of `logits` [n, V] (a reduced draft vocabulary's rows in head
    order, or rows with -inf outside it: those columns add nothing)."""
    rows = np.asarray(logits, dtype=np.float32)
    top = rows.max(axis=1, keepdims=True)
    return (1.0 / np.exp(rows - top).sum(axis=1)).astype(np.float64)


class ConfidenceCalibration:
    """Probability bin -> acceptance rate, from decayed counts with the bin's centre as a prior."""

    def __init__(self, bins: int = 10, prior_weight: float = 4.0, decay: float = 0.995):
        self.bins, self.prior_weight, self.decay = bins, prior_weight, decay
        self.prior = (np.arange(bins) + 0.5) / bins
        self.accepted = np.zeros(bins)
        self.tried = np.zeros(bins)

    def _bin(self, probabilities) -> np.ndarray:
        return np.clip((np.asarray(probabilities, dtype=np.float64) * self.bins).astype(int), 0, self.bins - 1)

    def __call__(self, probabilities: np.ndarray) -> np.ndarray:
        rates = (self.accepted + self.prior * self.prior_weight) / (self.tried + self.prior_weight)
        return rates[self._bin(probabilities)]

    def record(self, probability: float, accepted: bool) -> None:
        self.accepted *= self.decay
        self.tried *= self.decay
        b = int(self._bin(probability))
        self.accepted[b] += accepted
        self.tried[b] += 1.0

    def record_step(self, probabilities: np.ndarray, n_verified: int, n_accepted: int,
                    next_agrees: bool | None = None) -> None:
        """A step verified the first `n_verified` of the drafted slots rated `probabilities` and accepted
        `n_accepted`: each slot up to the first rejected one tells its outcome. `next_agrees`: whether the first
        slot left unverified equals the token the target emitted there (greedy, every verified slot accepted),
        without which a bin the map undervalues would never be verified and so never corrected."""
        for i in range(min(n_verified, n_accepted + 1)):
            self.record(float(probabilities[i]), i < n_accepted)
        if next_agrees is not None and n_accepted == n_verified < len(probabilities):
            self.record(float(probabilities[n_verified]), next_agrees)
