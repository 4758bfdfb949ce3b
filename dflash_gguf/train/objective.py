"""What each labelled block row contributes to the training loss: slot weights, the first-error cut, and the
mix of hard cross-entropy, distillation to the target's top-K and total variation to it.

Rows arrive block after block, slots 1..n of a block in order (the anchor row, slot 0, carries no label).
"""

from __future__ import annotations

import numpy as np


def slot_weights(block_size: int, gamma: float, supervised_slots: int | None = None) -> np.ndarray:
    """exp(-(k-1)/γ) for slot k ≥ 1 — a rejection ends the accepted run, so early slots matter most; slots past
    `supervised_slots` get no loss."""
    w = np.zeros(block_size)
    w[1:] = np.exp(-(np.arange(1, block_size) - 1) / gamma)
    if supervised_slots is not None:
        w[supervised_slots + 1:] = 0.0
    return w


def rows_up_to_first_error(correct, slots):
    """1.0 for each row at or before its block's first wrong slot, 0.0 after it: a greedy run never reaches
    the later slots, so their loss only pulls the drafter towards rows it will not be judged on (Spec-AUF)."""
    import torch  # noqa: PLC0415
    wrong = (~correct).long()
    starts = slots == 1
    block = torch.cumsum(starts.long(), 0) - 1
    wrong_before = torch.cumsum(wrong, 0) - wrong
    return (wrong_before - wrong_before[starts][block] == 0).float()


def row_losses(logp, labels, soft=None, distill: float = 0.0, tv: float = 0.0):
    """Per-row loss from log-probabilities [R, V'] over the loss columns: hard cross-entropy on the label
    (labels < 0 are clamped; their weight must be 0), plus `distill` share of cross-entropy to the target's
    top-K distribution `soft` and `tv` share of the total variation to it, which is 1 − the chance that a
    token drawn from the drafter is accepted by the target."""
    hard = -logp.gather(1, labels.clamp(min=0)[:, None])[:, 0]
    if soft is None or (distill == 0 and tv == 0):
        return hard
    loss = (1 - distill - tv) * hard
    if distill:
        loss = loss + distill * -(soft * logp).sum(-1)
    if tv:
        loss = loss + tv * 0.5 * (soft - logp.exp()).abs().sum(-1)
    return loss
