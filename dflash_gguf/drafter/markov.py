"""The DSpark Markov head (DeepSeek DeepSpec, vanilla low-rank): a bias W2·W1[prev] on each block slot's logits.

W1 [V, R] embeds the token before the slot (any target token: the anchor precedes slot 1), W2 [V', R] maps it
back to the drafter's columns (its draft vocabulary, or the whole vocabulary). Training is teacher-forced:
slot k's previous token is the target's token at anchor + k - 1 (DeepSpec's `prev_token_ids`). At inference
llama.cpp chains it on argmax tokens (src/models/dflash.cpp, build_dspark_markov_head); `chain` is that loop.
Counted by leading correct slots, the two agree: a chain that is right so far conditions on the true tokens.

Starts as a no-op: W1 = 0, so the bias is 0 everywhere and a DFlash drafter keeps its function; W2 starts
small and random so that W1 still gets a gradient. Rows of W1 for tokens never seen before a slot stay 0:
their bias is none at all rather than noise.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class MarkovHead(nn.Module):
    def __init__(self, n_vocab: int, rank: int, n_columns: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(n_vocab, rank)                 # [V, R]
        self.markov_w2 = nn.Linear(rank, n_columns, bias=False)      # weight [V', R]
        with torch.no_grad():
            self.markov_w1.weight.zero_()
            self.markov_w2.weight.normal_(0.0, 0.02)                 # DeepSpec's initializer_range

    def bias(self, prev: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """[N, C] bias for rows whose previous tokens are `prev` [N] (target ids); columns: which rows of W2
        (positions among the head's columns) the logits have, None for all of them."""
        w2 = self.markov_w2.weight if columns is None else self.markov_w2.weight[columns]
        return self.markov_w1(prev) @ w2.t()

    def chain(self, base: torch.Tensor, first_prev: int, column_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Inference: base logits [n, V'] of slots 1..n → the chained logits, each slot biased by the argmax
        token of the slot before (the anchor `first_prev` for slot 1). column_ids [V']: the target token of
        each column (the draft vocabulary), None when the columns are the whole vocabulary."""
        out, prev = [], int(first_prev)
        for row in base:
            row = row + self.bias(torch.tensor([prev], device=base.device))[0]
            out.append(row)
            best = int(row.argmax())
            prev = best if column_ids is None else int(column_ids[best])
        return torch.stack(out)


class ConfidenceHead(nn.Module):
    """Acceptance estimate of a slot: sigmoid(proj([h; W1[prev]])) (DeepSpec confidence_head_with_markov): h the
    slot's final-normed hidden state, W1[prev] the Markov embedding of the token before it."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1)

    def logit(self, hidden: torch.Tensor, prev_embedding: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([hidden, prev_embedding], dim=-1))[..., 0]

    def forward(self, hidden: torch.Tensor, prev_embedding: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logit(hidden, prev_embedding))


def teacher_forced_prev(block_tokens: np.ndarray, labels: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """[S] the token before each block row: the anchor for slot 1, the previous slot's label after it (the
    target's own token). Rows without a label (and anchor rows) get 0; they carry no loss."""
    before = np.roll(np.where(slot == 0, block_tokens, labels), 1)
    return np.where((slot > 0) & (before >= 0), before, 0).astype(np.int64)
