"""The target model: prefill, verify batches, feature taps and rollback (KV and recurrent state)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import UserError
from ..native.wrappers import Batch, Context, ContextSettings, Model, TapRows

# Called after every target decode with (features [rows, n_taps*n_embd], pos0 of the first row).
FeatureSink = Callable[[np.ndarray, int], None]


class ContextOverflow(UserError):
    """The prompt (plus generation) does not fit the context."""


@dataclass
class RollbackMode:
    kind: str          # "kv" (plain seq_rm), "snapshots" (n_rs_seq), "checkpoint" (state save + replay)
    n_rs_seq: int = 0


class Target:
    def __init__(self, model: Model, settings: ContextSettings, *, taps: Sequence[int] = (), max_verify: int = 16,
                 force_checkpoint: bool = False):
        """force_checkpoint: roll recurrent state back by checkpoint + replay even where the
        architecture supports per-token snapshots (for tests and for comparing the two)."""
        self.recurrent = model.has_recurrent_state()
        if self.recurrent and settings.n_rs_seq < max_verify and not force_checkpoint:
            settings = ContextSettings(**{**settings.__dict__, "n_rs_seq": max_verify})
        self.model = model
        self.ctx = Context(model, settings)
        self.rollback_mode = self._rollback_mode(max_verify)
        if taps:
            self.ctx.set_taps(list(taps))
        self.n_batch = settings.n_batch
        self.batch = Batch(model.native, max(settings.n_batch, max_verify + 1))
        self.n_past = 0                  # positions held in the KV cache
        self.tokens: list[int] = []      # the token at each held position (a prompt cache compares against it)
        self._checkpoint: bytes | None = None
        self._kept_rows: TapRows | None = None   # features of the rows a verify keeps, reused every step
        self._max_rows = max_verify + 1

    def _rollback_mode(self, max_verify: int) -> RollbackMode:
        if not self.recurrent:
            return RollbackMode("kv")
        n = self.ctx.n_rs_seq()
        return RollbackMode("snapshots", n) if n >= max_verify else RollbackMode("checkpoint")

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def reset(self) -> None:
        self.ctx.clear()
        self.n_past = 0
        self.tokens = []

    def truncate(self, n: int) -> bool:
        """Keep positions 0..n-1 (a prefix to reuse); False, with nothing changed, where the memory cannot
        (recurrent state only rolls back within a verify: it keeps its whole sequence or nothing)."""
        if n >= self.n_past:
            return n == self.n_past
        if self.recurrent or not self.ctx.seq_rm(n, -1):
            return False
        self.n_past = n
        del self.tokens[n:]
        return True

    def check_fits(self, n_prompt: int, n_new: int = 1) -> None:
        if n_prompt + n_new > self.n_ctx:
            raise ContextOverflow(f"prompt of {n_prompt} tokens + {n_new} to generate does not fit the context of "
                                  f"{self.n_ctx} tokens ({self.model.path.name}); raise --ctx or shorten the prompt")

    def prefill(self, tokens: Sequence[int], sink: FeatureSink | None) -> np.ndarray:
        """Decode tokens at n_past.. in chunks of n_batch; return the logits of the last row (a copy)."""
        self.check_fits(self.n_past + len(tokens))
        for i in range(0, len(tokens), self.n_batch):
            chunk = tokens[i:i + self.n_batch]
            last_chunk = i + self.n_batch >= len(tokens)
            self.batch.set_tokens(chunk, self.n_past, "last" if last_chunk else "none")
            self.ctx.decode(self.batch, "prefill")
            if sink is not None and self.ctx.taps:
                sink(self.ctx.get_taps(0, len(chunk)), self.n_past)
            self.n_past += len(chunk)
            self.tokens.extend(chunk)
        return np.array(self.ctx.logits(-1))

    def decode_rows(self, tokens: Sequence[int]) -> np.ndarray:
        """Decode tokens at n_past.. with logits on every row: the verify batch. Returns a [n, V] view.

        The positions stay in the cache until `keep()` trims them.
        """
        if self.rollback_mode.kind == "checkpoint":
            self._checkpoint = self.ctx.state_get()
        self.check_fits(self.n_past + len(tokens), 0)
        self.batch.set_tokens(tokens, self.n_past, "all")
        self.ctx.decode(self.batch, "verify")
        self.n_past += len(tokens)
        self.tokens.extend(tokens)
        return self.ctx.logits_all(len(tokens))

    def time_verify(self, tokens: Sequence[int], clock: Callable[[], float] = time.perf_counter) -> float:
        """Seconds one verify batch of `tokens` takes after the current context; the cache is left as it was."""
        t0 = clock()
        self.decode_rows(tokens)
        dt = clock() - t0
        self.keep(0, len(tokens))
        return dt

    def features(self, i0: int, n_rows: int) -> np.ndarray:
        """Features [n_rows, n_taps*n_embd] of rows i0.. of the last decode: a view of a buffer that the next
        call overwrites (the drafter copies what it keeps)."""
        rows = self._kept_rows
        if rows is None or rows.width != self.ctx.taps_width or rows.capacity < n_rows:
            rows = self._kept_rows = TapRows(max(self._max_rows, n_rows), self.ctx.taps_width)
        return self.ctx.read_taps(i0, n_rows, rows)

    def keep(self, n_keep: int, n_decoded: int) -> None:
        """After a verify of n_decoded rows, keep only the first n_keep of them."""
        if n_keep == n_decoded:
            return
        start = self.n_past - n_decoded
        if self.rollback_mode.kind == "checkpoint":
            replay = self.batch.tokens(n_keep)
            self.ctx.state_set(self._checkpoint)
            if not self.ctx.seq_rm(start, -1):
                raise RuntimeError(f"{self.model.path.name}: cannot remove positions >= {start} after restore")
            self.n_past = start
            del self.tokens[start:]
            if replay:
                self.batch.set_tokens(replay, start, "none")
                self.ctx.decode(self.batch, "rollback replay")
                self.n_past += len(replay)
                self.tokens.extend(replay)
            return
        if not self.ctx.seq_rm(start + n_keep, -1):
            raise RuntimeError(f"{self.model.path.name}: the memory refused to roll back {n_decoded - n_keep} "
                               f"positions (rollback mode {self.rollback_mode.kind})")
        self.n_past = start + n_keep
        del self.tokens[self.n_past:]

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
