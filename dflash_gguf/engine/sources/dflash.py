"""DFlash draft source: a `dflash` GGUF run by llama.cpp, drafting a block of masked slots from the target's
features. DFlash2 and DSpark (dflash2.py, dspark.py) extend it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...errors import UserError
from ...gguf_family import DFLASH
from ...native.wrappers import Context, ContextSettings, Model
from ..confidence import top_probabilities
from ..drafter_driver import DrafterDriver
from .base import DraftSource, Proposal


class DFlashSource(DraftSource):
    """A `dflash` GGUF run by llama.cpp, sharing the target's embeddings and LM head via ctx_other."""

    member = DFLASH.name                          # the DFlash family member (DFlash2Source, DSparkSource override it)
    rates_by_probability = True                   # --draft-trim rates its slots by its top probabilities
    reads_draft_vocab_rows = True                 # takes a reduced draft vocabulary's logits in head order

    def __init__(self, model: Model, target_ctx: Context, settings: ContextSettings, target_model: Model,
                 *, window: int | None = None):
        """window: keep only the context K/V of the latest `window - block_size` positions (a sliding
        window over the context; positions stay absolute), bounding the drafter's KV memory."""
        self.model = model
        block_size = model.block_size() or 16
        if window is not None:
            if window < 2 * block_size:
                raise UserError(f"--draft-ctx {window} is too small: it must hold at least two blocks "
                                f"({2 * block_size} positions for {model.path.name})")
            settings = replace(settings, n_ctx=window, n_batch=min(settings.n_batch, window - block_size))
        self.window = window
        self.driver = DrafterDriver(model, target_ctx, settings)
        self.ctx = self.driver.ctx
        self.taps, self.block_size, self.n_batch = self.driver.taps, self.driver.block_size, self.driver.n_batch
        self.short_blocks = False
        self.n_vocab = target_model.n_vocab
        self.rates_slots = False
        # a reduced draft vocabulary's logits come in head order: row i's token is d2t[i]
        self._d2t = self.driver.use_draft_vocab_rows() if self.reads_draft_vocab_rows else None
        # Kept rows wait here until the next draft needs them, or until a full injection batch is pending:
        # injected one row per decode they cost 68 us a row, in batches of 16 or more 17-18 us (measured:
        # shipped SmolLM2 drafter, one thread, 2-core EPYC; a plain step is ~5.7 ms). Capped at one ubatch,
        # past which batching gains nothing, so the buffer stays small for any prompt length.
        self._pending = np.empty((self.n_batch, self.driver.width), dtype=np.float32)   # [n_batch, n_taps*n_embd]
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
        self.driver.inject(self._pending[:n], pos0)
        self._n_pending = 0
        return n

    def rate_slots(self) -> bool:
        """Rate each draft's slots from now on by the drafter's top probability (engine/confidence.py)."""
        self.rates_slots = True
        return True

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        """pick (T>0, rejection mode): the loop's sampler, `pick(logits [V]) -> (token, q [V])`, for sources
        whose later slots depend on the tokens drawn earlier; DFlash's slots do not, so it is unused here."""
        rows = self._decode_block(last_token, pos, n + 1)
        logits = self.driver.logits(rows)[1:n + 1]                     # row 0 is the anchor
        best = logits.argmax(axis=1)
        if self._d2t is None:
            proposal = Proposal([int(t) for t in best], np.array(logits) if want_logits else None)
        else:
            proposal = Proposal(self._d2t[best].tolist(), self._vocabulary_rows(logits) if want_logits else None)
        if self.rates_slots and n:
            proposal.confidence = top_probabilities(logits)      # head-order rows: the draft vocabulary only
        self.driver.drop_block(pos)
        return proposal

    def _vocabulary_rows(self, logits: np.ndarray) -> np.ndarray:
        """Draft-vocabulary logit rows [n, K] as the sampler takes them: [n, n_vocab], -inf outside d2t (what the
        graph writes when it scatters them itself)."""
        rows = np.full((logits.shape[0], self.n_vocab), -np.inf, dtype=np.float32)
        rows[:, self._d2t] = logits
        return rows

    def _decode_block(self, last_token: int, pos: int, needed: int) -> int:
        """Decode `[last, MASK…]` at pos; returns its row count. The full trained block (the drafter saw
        block_size-1 masks in training), or with short_blocks only the `needed` rows: cheaper where the
        drafter's cost grows with its rows (CPUs), at a small loss of acceptance; the policy's calibration
        decides (cost.measure_cost_curve). The caller removes the block's K/V (driver.drop_block(pos))."""
        self.flush()
        rows = needed if self.short_blocks else self.block_size
        self.driver.decode_block(last_token, pos, rows)
        return rows

    def pos_max(self) -> int:
        self.flush()
        return self.ctx.pos_max()

    def close(self) -> None:
        self.driver.close()
