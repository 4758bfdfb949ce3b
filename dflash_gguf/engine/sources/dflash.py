"""DFlash draft source: a `dflash` GGUF run by llama.cpp, drafting a block of masked slots from the target's
features. DFlash2 and DSpark (dflash2.py, dspark.py) extend it."""

from __future__ import annotations

import numpy as np

from ...errors import UserError
from ...gguf_family import DFLASH
from ...native.wrappers import Batch, Context, ContextSettings, Model
from .base import DraftSource, Proposal


class DFlashSource(DraftSource):
    """A `dflash` GGUF run by llama.cpp, sharing the target's embeddings and LM head via ctx_other."""

    member = DFLASH.name                          # the DFlash family member (DFlash2Source, DSparkSource override it)

    def __init__(self, model: Model, target_ctx: Context, settings: ContextSettings, target_model: Model,
                 *, window: int | None = None):
        """window: keep only the context K/V of the latest `window - block_size` positions (a sliding
        window over the context; positions stay absolute), bounding the drafter's KV memory."""
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
        # Kept rows wait here until the next draft needs them, or until a full injection batch is pending:
        # injected one row per decode they cost 68 us a row, in batches of 16 or more 17-18 us (measured:
        # shipped SmolLM2 drafter, one thread, 2-core EPYC; a plain step is ~5.7 ms). Capped at one ubatch,
        # past which batching gains nothing, so the buffer stays small for any prompt length.
        self._pending = np.empty((self.n_batch, width), dtype=np.float32)   # [n_batch, n_taps*n_embd]
        self._n_pending = 0
        self._pending_pos0 = 0

    def begin(self) -> None:
        self.ctx.clear()
        self._n_pending = 0

    def truncate(self, n: int) -> bool:
        """Keep the context of positions 0..n-1 (pending rows included), as if only those had been injected;
        False, with nothing changed, where a sliding window has dropped positions a cold start would hold."""
        if self.window is not None and self.ctx.pos_min() > 0:
            return False
        if not self.ctx.seq_rm(n, -1):
            return False
        self._n_pending = min(self._n_pending, max(n - self._pending_pos0, 0))
        return True

    def process(self, features: np.ndarray, pos0: int) -> None:
        n, k = features.shape[0], self._n_pending
        if k == 0:
            self._pending_pos0 = pos0
        elif pos0 != self._pending_pos0 + k:
            raise ValueError(f"features for position {pos0} follow pending rows "
                             f"{self._pending_pos0}..{self._pending_pos0 + k - 1}")
        if k + n < self.n_batch:             # a step's rows: the common case, kept short (it runs every token)
            self._pending[k:k + n] = features
            self._n_pending = k + n
            return
        i = 0
        while i < n:
            if self._n_pending == 0:
                self._pending_pos0 = pos0 + i
            take = min(n - i, self.n_batch - self._n_pending)
            self._pending[self._n_pending:self._n_pending + take] = features[i:i + take]
            self._n_pending += take
            i += take
            if self._n_pending == self.n_batch:
                self.flush()

    def flush(self) -> int:
        """Inject the pending rows in one non-causal decode (they fit one ubatch); returns their count."""
        n, pos0 = self._n_pending, self._pending_pos0
        if n == 0:
            return 0
        evict_below = pos0 + n + self.block_size - (self.window or 1 << 62)
        if evict_below > 0:                  # room for these rows and the next draft block
            self.ctx.seq_rm(0, evict_below)
        self.embd_batch.set_embd(self._pending[:n], pos0, "none")
        self.ctx.decode(self.embd_batch, "feature injection")
        self._n_pending = 0
        return n

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
        self.flush()
        rows = needed if self.short_blocks else self.block_size
        self.tok_batch.set_tokens([last_token] + [self.mask] * (rows - 1), pos, "all")
        self.ctx.decode(self.tok_batch, "draft")
        return rows

    def pos_max(self) -> int:
        self.flush()
        return self.ctx.pos_max()

    def close(self) -> None:
        self.embd_batch.close()
        self.tok_batch.close()
        self.ctx.close()
