"""The drafter's forward pass through llama.cpp, written once: the target's tapped features go into the drafter's
KV, a block `[anchor, MASK…]` is decoded non-causally, its rows are read and its own K/V dropped.

The DFlash-family draft sources (engine/sources/) draft with it, `bench --tau` walks target-written text with it,
and convert's load check runs one injection and one block through it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..native.wrappers import Batch, Context, ContextSettings, Model


class DrafterDriver:
    """A drafter GGUF's llama.cpp context, linked to a target context (ctx_other: the drafter reads the target's
    embeddings and LM head), with its two batches: injected feature rows and the draft block."""

    def __init__(self, model: Model, target_ctx: Context, settings: ContextSettings):
        self.model = model
        self.taps = model.target_layer_ids()
        self.block_size = model.block_size() or 16
        self.mask = model.mask_token()
        # The non-causal block must sit in one ubatch. Beyond that a small ubatch keeps the compute
        # buffer small: it is reserved for n_ubatch rows of logits (SmolLM2: 256 rows = 49 MiB, 32 = 6 MiB).
        ubatch = max(self.block_size, min(settings.n_ubatch, settings.n_batch, 64))
        settings = replace(settings, n_ubatch=ubatch, n_batch=max(settings.n_batch, ubatch))
        self.ctx = Context(model, settings, other=target_ctx)
        self.ctx.set_causal(False)
        self.width = len(self.taps) * target_ctx.model.n_embd      # one injected row: [n_taps*n_embd]
        self.n_batch = ubatch               # rows per injection decode: a non-causal decode must fit one ubatch
        self.embd_batch = Batch(model.native, settings.n_batch, self.width)
        self.block_batch = Batch(model.native, self.block_size)

    def inject(self, features: np.ndarray, pos0: int) -> None:
        """Decode feature rows [n, width] at positions pos0.. into the KV, n_batch rows a decode."""
        for i in range(0, features.shape[0], self.n_batch):
            self.embd_batch.set_embd(features[i:i + self.n_batch], pos0 + i, "none")
            self.ctx.decode(self.embd_batch, "feature injection")

    def decode_block(self, anchor: int, pos: int, rows: int) -> None:
        """Decode `[anchor, MASK × (rows - 1)]` at pos with output on every row (`logits`, or the context's nextn
        rows); its K/V stay until `drop_block(pos)`."""
        self.block_batch.set_tokens([anchor] + [self.mask] * (rows - 1), pos, "all")
        self.ctx.decode(self.block_batch, "draft")

    def use_draft_vocab_rows(self) -> np.ndarray | None:
        """From the next block on, `logits` gives a drafter with a reduced draft vocabulary its K head rows' logits
        only, in head order, rather than the vocabulary's rows with -inf outside it (which cost filling and
        copying, ~12x the floats for SmolLM2's drafter); returns the target token of each head row (d2t), or None
        where the drafter has none or chains a head over its logits (DSpark, DFlash2), nothing changed."""
        d2t = self.model.draft_vocab()
        if d2t is None or not self.ctx.set_draft_vocab_logits(True):
            return None
        return d2t

    def logits(self, rows: int) -> np.ndarray:
        """[rows, V] logits of the block rows in order (the dflash graph writes every row whatever the output
        flags say; V is the draft vocabulary's K after `use_draft_vocab_rows`); a view valid until the next
        decode."""
        return self.ctx.logits_all(rows)

    def drop_block(self, pos: int) -> None:
        """Remove the K/V of positions pos.. (a block's own K/V are never kept)."""
        self.ctx.seq_rm(pos, -1)

    def close(self) -> None:
        self.embd_batch.close()
        self.block_batch.close()
        self.ctx.close()
