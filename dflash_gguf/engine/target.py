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

# Stock ggml-cpu runs flash attention tiled, with another summation order, for a ubatch of >= 64 query rows
# (GGML_FA_TILE_Q) and row by row below that. Our build (patches/0012) computes each row in one order whatever the
# ubatch width, and the matmuls give the same bits for any width (ggml-kernels/cpu): then a generated position's
# KV is what a prefill computes and a held sequence is reused as it is. Where the order still depends on the width
# (stock paths: DFLASH_CPU_ISA=none, flash attention off, a GPU), a position's KV depends on whether its ubatch
# was "wide": a reused prefix is exact only where each position was computed as a prefill of the whole sequence
# from 0 would compute it.
WIDE_ROWS = 64
# The tiled kernel takes only F16 / F32 K and V of one type: with other KV cache types (-ctk q8_0 -ctv q8_0)
# every ubatch width gives the same bits (measured: SmolLM2 Q4_1, 700 tokens as 512+188, 7x100, 16-row ubatches)
TILED_KV_TYPES = ("f16", "f32")


def width_invariant(settings: ContextSettings, cpu_one_order: bool = False) -> bool:
    """Whether a position's KV comes out the same in a ubatch of any width: flash attention on, and either our
    CPU build's one order per row (cpu_one_order: the model's attention runs there) or KV types the tiled
    kernel does not take."""
    k, v = settings.type_k or "f16", settings.type_v or "f16"
    return settings.flash_attn != "off" and (cpu_one_order or not (k == v and k in TILED_KV_TYPES))


def cpu_one_order(model: Model) -> bool:
    """Whether the model's attention runs on a CPU build that computes each row in one order (patches/0012)."""
    from ..native.cpu_kernels import CpuKernels  # noqa: PLC0415
    return not model.on_gpu and CpuKernels(model.native).flash_attn_one_order


class ContextOverflow(UserError):
    """The prompt (plus generation) does not fit the context."""


def check_prompt_fits(n_prompt: int, n_ctx: int, n_predict: int = 1) -> None:
    """The one prompt-fits-context rule (run, serve, the loop): the context's n_ctx positions hold the prompt and
    at least one generated token. n_predict: the tokens asked for, which the suggested -c adds to the prompt."""
    if n_prompt + 1 > n_ctx:
        raise ContextOverflow(f"the prompt alone is {n_prompt} tokens and the context holds {n_ctx} positions, with "
                              f"the tokens it generates; pass -c {n_prompt + max(n_predict, 1)} or more (prompt + "
                              "tokens to generate), or shorten the prompt")


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
        self.n_batch = min(settings.n_batch, settings.n_ubatch)   # one decode = one ubatch (see WIDE_ROWS)
        self.batch = Batch(model.native, max(settings.n_batch, max_verify + 1))
        self.n_past = 0                  # positions held in the KV cache
        self.tokens: list[int] = []      # the token at each held position (a prompt cache compares against it)
        self.wide: list[bool] = []       # whether each held position was decoded in a ubatch of >= WIDE_ROWS
        self.width_invariant = width_invariant(settings, cpu_one_order(model))   # every position counts as wide
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
        self.wide = []

    def truncate(self, n: int) -> bool:
        """Keep positions 0..n-1 (a prefix to reuse); False, with nothing changed, where the memory cannot
        (recurrent state only rolls back within a verify: it keeps its whole sequence or nothing)."""
        if n >= self.n_past:
            return n == self.n_past
        if self.recurrent or not self.ctx.seq_rm(n, -1):
            return False
        self.n_past = n
        del self.tokens[n:]
        del self.wide[n:]
        return True

    def _is_wide(self, rows: int) -> bool:
        return self.width_invariant or rows >= WIDE_ROWS

    def _cold_wide_end(self, n: int) -> int:
        """Positions below this are wide when n tokens are prefilled from position 0 in ubatches of n_batch."""
        if self.width_invariant:
            return n
        if self.n_batch < WIDE_ROWS:
            return 0
        tail = n - ((n - 1) // self.n_batch) * self.n_batch          # rows of the last ubatch
        return n if tail >= WIDE_ROWS else n - tail

    def reusable(self, k: int, n: int) -> int:
        """The longest prefix (<= k) of the held positions that a prefill of n tokens from 0 computes the same
        way, moved back so that what is left to decode before the narrow tail fills a wide ubatch."""
        if self.width_invariant:
            return k
        wide_end = self._cold_wide_end(n)
        k = min(k, next((i for i in range(min(k, self.n_past)) if self.wide[i] != (i < wide_end)), k))
        if 0 < wide_end - k < WIDE_ROWS:
            k = max(wide_end - WIDE_ROWS, 0)
        return k

    def _chunks(self, n_new: int, all_wide: bool = False) -> list[int]:
        """Ubatch sizes for positions n_past..n_past+n_new-1 that make each wide or narrow as a prefill from 0
        of the whole sequence would (all_wide: every one wide, as a prefill of a longer sequence would)."""
        start, end, B = self.n_past, self.n_past + n_new, self.n_batch
        if B < WIDE_ROWS:
            return [min(B, end - i) for i in range(start, end, B)]
        wide_end = end if all_wide else max(self._cold_wide_end(end), start)
        sizes = [B] * ((wide_end - start) // B)
        rest = (wide_end - start) % B
        if rest:
            if rest < WIDE_ROWS and sizes:                          # borrow rows from the previous ubatch
                sizes[-1] -= WIDE_ROWS - rest
                rest = WIDE_ROWS
            sizes.append(rest)
        if end > wide_end:
            sizes.append(end - wide_end)
        return sizes

    def prefill(self, tokens: Sequence[int], sink: FeatureSink | None, *, all_wide: bool = False) -> np.ndarray:
        """Decode tokens at n_past.. in ubatches of at most n_batch, each position wide or narrow as a prefill of
        the whole sequence from 0 makes it (`_chunks`); return the logits of the last row (a copy)."""
        check_prompt_fits(self.n_past + len(tokens), self.n_ctx)
        i = 0
        for size in self._chunks(len(tokens), all_wide):
            chunk = tokens[i:i + size]
            i += size
            wanted = "last" if i >= len(tokens) else "none"
            self.batch.set_tokens(chunk, self.n_past, self.ctx.outputs_for_taps(wanted))
            self.ctx.decode(self.batch, "prefill")
            if sink is not None and self.ctx.taps:
                sink(self.ctx.get_taps(0, len(chunk)), self.n_past)
            self.n_past += len(chunk)
            self.tokens.extend(chunk)
            self.wide.extend([self._is_wide(size)] * size)
        return np.array(self.ctx.logits(-1))

    def decode_rows(self, tokens: Sequence[int]) -> np.ndarray:
        """Decode tokens at n_past.. with logits on every row: the verify batch. Returns a [n, V] view.

        The positions stay in the cache until `keep()` trims them.
        """
        if self.rollback_mode.kind == "checkpoint":
            self._checkpoint = self.ctx.state_get()
        if self.n_past + len(tokens) > self.n_ctx:          # the loop drafts only into the room left (loop.py)
            raise RuntimeError(f"{self.model.path.name}: a verify of {len(tokens)} rows after {self.n_past} positions "
                               f"runs past the context of {self.n_ctx}")
        self.batch.set_tokens(tokens, self.n_past, "all")
        self.ctx.decode(self.batch, "verify")
        self.n_past += len(tokens)
        self.tokens.extend(tokens)
        self.wide.extend([self._is_wide(len(tokens))] * len(tokens))
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
            del self.wide[start:]
            if replay:
                self.batch.set_tokens(replay, start, self.ctx.outputs_for_taps("none"))
                self.ctx.decode(self.batch, "rollback replay")
                self.n_past += len(replay)
                self.tokens.extend(replay)
                self.wide.extend([self._is_wide(len(replay))] * len(replay))
            return
        if not self.ctx.seq_rm(start + n_keep, -1):
            raise RuntimeError(f"{self.model.path.name}: the memory refused to roll back {n_decoded - n_keep} "
                               f"positions (rollback mode {self.rollback_mode.kind})")
        self.n_past = start + n_keep
        del self.tokens[self.n_past:]
        del self.wide[self.n_past:]

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
