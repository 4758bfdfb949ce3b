"""Draft sources: one small interface, the DFlash drafter behind it (others can slot in).

The loop calls, in order: `begin()` once per generation, `process(features, pos0)` after every
target decode with the features of the rows it keeps, `draft(last, pos, n)` for a block, and
`rollback(pos)` to drop everything at positions >= pos.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import UserError
from ..gguf_check import DRAFTER_ARCH, FOREIGN_DRAFTER_ARCHS
from ..native.wrappers import Batch, Context, ContextSettings, Model


@dataclass
class Proposal:
    tokens: list[int]                 # d1..dn
    logits: np.ndarray | None = None  # [n, V] drafter logits for d1..dn (needed for T>0), a copy
    q: np.ndarray | None = None       # [n, V] proposal distributions the tokens were drawn from (T>0)


class DraftSource(Protocol):
    block_size: int                   # max tokens per draft call, including the anchor slot
    taps: list[int]                   # target layer ids whose features `process` expects

    def begin(self) -> None: ...
    def process(self, features: np.ndarray, pos0: int) -> None: ...
    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal: ...
    def rollback(self, pos: int) -> None: ...


class DrafterMismatch(UserError):
    """The drafter does not fit the target."""


def check_drafter_fits(drafter: Model, target: Model) -> None:
    """The checks that make a drafter usable with a target; each error says what to fix."""
    name = drafter.path.name
    if drafter.arch != DRAFTER_ARCH:
        hint = (f"convert it first with `dflash-gguf convert {drafter.path} --target {target.path} -o draft.gguf`"
                if drafter.arch in FOREIGN_DRAFTER_ARCHS else "pass a DFlash drafter with -md")
        raise DrafterMismatch(f"{name}: architecture is '{drafter.arch}', not '{DRAFTER_ARCH}'; {hint}")
    if drafter.n_embd != target.n_embd:
        raise DrafterMismatch(f"{name}: hidden size {drafter.n_embd} != target {target.path.name} hidden size "
                              f"{target.n_embd}; this drafter was trained for another target")
    taps = drafter.target_layer_ids()
    if not taps or max(taps) > target.n_layer or min(taps) < 0:
        raise DrafterMismatch(f"{name}: target layers {taps} do not exist in {target.path.name} "
                              f"({target.n_layer} layers); this drafter was trained for another target")
    mask = drafter.mask_token()
    if not 0 <= mask < target.n_vocab:
        raise DrafterMismatch(f"{name}: mask token id {mask} is outside the target vocabulary ({target.n_vocab})")


class DFlashDrafter:
    """A `dflash` GGUF run by llama.cpp, sharing the target's embeddings and LM head via ctx_other."""

    def __init__(self, model: Model, target_ctx: Context, settings: ContextSettings, target_model: Model,
                 *, window: int | None = None):
        """window: keep only the context K/V of the latest `window - block_size` positions (a sliding
        window over the context; positions stay absolute), bounding the drafter's KV memory."""
        check_drafter_fits(model, target_model)
        self.model = model
        self.taps = model.target_layer_ids()
        self.block_size = model.block_size() or 16
        self.short_blocks = False
        self.mask = model.mask_token()
        if window is not None:
            if window < 2 * self.block_size:
                raise UserError(f"--draft-ctx {window} is too small: it must hold at least two blocks "
                                f"({2 * self.block_size} positions for {model.path.name})")
            settings = ContextSettings(**{**settings.__dict__, "n_ctx": window,
                                          "n_batch": min(settings.n_batch, window - self.block_size)})
        self.window = window
        # The non-causal block must sit in one ubatch. Beyond that a small ubatch keeps the compute
        # buffer small: it is reserved for n_ubatch rows of logits (SmolLM2: 256 rows = 49 MiB, 32 = 6 MiB).
        ubatch = max(self.block_size, min(settings.n_ubatch, settings.n_batch, 64))
        settings = ContextSettings(**{**settings.__dict__, "n_ubatch": ubatch, "n_batch": max(settings.n_batch, ubatch)})
        self.ctx = Context(model, settings, other=target_ctx)
        self.ctx.set_causal(False)
        width = len(self.taps) * target_model.n_embd
        self.n_batch = ubatch               # injection chunks: a non-causal decode must fit one ubatch
        self.embd_batch = Batch(model.native, settings.n_batch, width)
        self.tok_batch = Batch(model.native, self.block_size)
        self.n_vocab = target_model.n_vocab
        self._pending: list[tuple[np.ndarray, int]] = []   # (features [rows, width], pos0) not yet injected

    def begin(self) -> None:
        self.ctx.clear()
        self._pending.clear()

    def process(self, features: np.ndarray, pos0: int) -> None:
        # Buffered until the next draft: while the policy runs plain decoding, many steps' rows
        # go in as one injection batch instead of one small decode per step.
        self._pending.append((features, pos0))   # callers hand over fresh arrays

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = np.concatenate([f for f, _ in self._pending])
        pos0 = self._pending[0][1]
        self._pending.clear()
        for i in range(0, rows.shape[0], self.n_batch):
            chunk = rows[i:i + self.n_batch]
            evict_below = pos0 + i + chunk.shape[0] + self.block_size - (self.window or 1 << 62)
            if evict_below > 0:              # room for this chunk and the next draft block
                self.ctx.seq_rm(0, evict_below)
            self.embd_batch.set_embd(chunk, pos0 + i, "none")
            self.ctx.decode(self.embd_batch, "feature injection")

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        """pick (T>0, rejection mode): the loop's sampler, `pick(logits [V]) -> (token, q [V])`, for sources
        whose later slots depend on the tokens drawn earlier; DFlash's slots do not, so it is unused here."""
        rows = self._decode_block(last_token, pos, n + 1)
        # The dflash graph ignores output flags: it writes logits for every block row in order, so
        # ask for all of them and read rows 1..n (row 0 is the anchor).
        logits = self.ctx.logits_all(rows)[1:n + 1]
        proposal = Proposal([int(t) for t in logits.argmax(axis=1)], np.array(logits) if want_logits else None)
        self.ctx.seq_rm(pos, -1)             # the block's own K/V are never kept
        return proposal

    def _decode_block(self, last_token: int, pos: int, needed: int) -> int:
        """Decode `[last, MASK…]` at pos; returns its row count. The full trained block (the drafter saw
        block_size-1 masks in training), or with short_blocks only the `needed` rows: cheaper where the
        drafter's cost grows with its rows (CPUs), at a small loss of acceptance; the policy's calibration
        decides (policy.measure_cost_curve). The caller removes the block's K/V (seq_rm(pos))."""
        self._flush()
        rows = needed if self.short_blocks else self.block_size
        self.tok_batch.set_tokens([last_token] + [self.mask] * (rows - 1), pos, "all")
        self.ctx.decode(self.tok_batch, "draft")
        return rows

    def rollback(self, pos: int) -> None:
        self._flush()
        self.ctx.seq_rm(pos, -1)

    def pos_max(self) -> int:
        self._flush()
        return self.ctx.pos_max()

    def close(self) -> None:
        self.embd_batch.close()
        self.tok_batch.close()
        self.ctx.close()
