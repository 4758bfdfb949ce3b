"""Training data from the target itself: it writes the responses, and what it computed on the way is kept.

Generation runs many sequences in one batch (each sequence has its own KV stream), and per position it keeps
the tapped hidden states (optional: they can be recomputed later by a batched prefill of the tokens) and the
target's top-k next-token probabilities (free: the logits were computed anyway; used for distillation).
A row may carry `followups`: further user turns, answered in the same sequence (multi-turn data).

Layout of a dataset folder (append-only; a harvest resumes where it stopped):
  tokens.bin   int32 [N]             all sequences back to back (prompt + responses)
  feats.bin    [N, k*H]              features of each position (the row of the last token is zero); optional;
                                     float16, or bfloat16 where the target's hidden states exceed float16
                                     (meta "feature_dtype"; features.py)
  topk_ids.bin int32 [N, K]          the target's K most likely next tokens after each position (-1: none)
  topk_p.bin   float16 [N, K]        their probabilities (T = 1)
  index.jsonl  one row per sequence {prompt_index, offset, length, spans, category, source, sampled}
               spans: [start, end) ranges of target-written tokens
  meta.json    target (name, sha256), prompt set sha256, seed, taps, n_embd, feature_dtype, settings
  ranges.json  [min, max] of each tap's stored features
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..engine.sampling import SamplingParams, pick
from ..target_file import TargetFile
from ..textgen.prompting import format_prompt, is_completion, next_turn_tokens
from . import features as fx


@dataclass
class HarvestSettings:
    taps: list[int]
    max_new: dict = field(default_factory=lambda: {"code": 192, "math": 256, "chat": 320})
    n_parallel: int = 8
    ctx_per_seq: int = 1024
    sampled_fraction: float = 0.2         # the rest is greedy
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.9
    seed: int = 0
    n_threads: int = 0
    store_features: bool = True
    top_k_probs: int = 8                  # 0: keep no probabilities
    n_gpu_layers: int = 0
    feature_dtype: str = "float16"        # float16 | bfloat16 | float32 (train/preflight.py picks it by range)
    chat_template: str | None = None      # jinja text for chat rows (None: textgen.chat.model_template's)
    processes: int = 1                    # harvest_shards.py: processes side by side, n_threads each


@dataclass
class _Slot:
    seq: int
    prompt_index: int
    row: dict
    tokens: list[int]
    feats: list[np.ndarray]
    topk_ids: list[np.ndarray]
    topk_p: list[np.ndarray]
    spans: list[list[int]]
    max_new: int
    sampling: SamplingParams
    rng: np.random.Generator
    followups: list[str]


class DatasetWriter:
    """Appends sequences to a dataset folder; refuses a folder made for another target, prompt set or taps.
    Several harvest processes (shards) may append to one folder: each sequence is written under a file lock."""

    KEYS = ("target_sha256", "prompts_sha256", "seed", "taps", "store_features", "top_k_probs", "feature_dtype")

    def __init__(self, out: Path, meta: dict):
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        meta_path = out / "meta.json"
        meta = {"feature_dtype": "float16"} | meta
        if meta_path.exists():
            old = {"feature_dtype": "float16"} | json.loads(meta_path.read_text())
            diff = [k for k in self.KEYS if old.get(k) != meta.get(k)]
            if diff:
                raise ValueError(f"{out} holds data made with other {', '.join(diff)}; use another folder")
        else:
            meta_path.write_text(json.dumps(meta, indent=2))
        self.meta = meta
        self.feature_dtype = meta["feature_dtype"]
        self.index = out / "index.jsonl"
        with self._locked():
            rows = self._rows()
            self.done = {r.get("prompt_index", i) for i, r in enumerate(rows)}
            self.offset = rows[-1]["offset"] + rows[-1]["length"] if rows else 0
            self._truncate_tails()
        self.n_tokens_written = 0
        self.n_response_written = 0

    def _truncate_tails(self) -> None:
        """Drop bytes past the last indexed sequence (a harvest killed between two appends)."""
        width = {"tokens.bin": 4, "topk_ids.bin": 4 * self.meta["top_k_probs"], "topk_p.bin": 2 * self.meta["top_k_probs"],
                 "feats.bin": fx.BYTES[self.feature_dtype] * len(self.meta["taps"]) * self.meta["n_embd"]}
        for name, w in width.items():
            path = self.out / name
            if path.exists() and path.stat().st_size > self.offset * w:
                with open(path, "r+b") as f:
                    f.truncate(self.offset * w)

    def _rows(self) -> list[dict]:
        return [json.loads(x) for x in self.index.read_text().splitlines() if x.strip()] if self.index.exists() else []

    @contextlib.contextmanager
    def _locked(self):
        import fcntl  # noqa: PLC0415
        with open(self.out / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _append(self, name: str, arr: np.ndarray) -> None:
        with open(self.out / name, "ab") as f:
            f.write(arr.tobytes())

    def add(self, tokens: list[int], spans: list[list[int]], row: dict, *, prompt_index: int, sampled: bool,
            feats: np.ndarray | None = None, topk_ids: np.ndarray | None = None, topk_p: np.ndarray | None = None
            ) -> None:
        """One sequence: its tokens, the [start, end) spans the target wrote, and per position its features
        [n, k*H] and top-K ids/probabilities [n, K] when the dataset keeps them."""
        n = len(tokens)
        if (feats is None) == bool(self.meta["store_features"]) or (topk_ids is None) == bool(self.meta["top_k_probs"]):
            raise ValueError("features / top-k probabilities do not match what this dataset keeps")
        stored = None
        if feats is not None:
            try:
                stored = fx.encode(feats, self.feature_dtype)
            except fx.NonFiniteFeatures as e:
                from ..errors import RunFailure  # noqa: PLC0415
                raise RunFailure(f"{self.out}: {e} (sequence of prompt {prompt_index}); nothing of it was stored: "
                                 "check the target file, or harvest with another feature dtype") from None
        with self._locked():
            if stored is not None:
                fx.merge_ranges(self.out / "ranges.json", fx.tap_ranges(feats, len(self.meta["taps"])))
            self.offset = (self.out / "tokens.bin").stat().st_size // 4 if (self.out / "tokens.bin").exists() else 0
            self._write(tokens, spans, row, prompt_index, sampled, stored, topk_ids, topk_p)
        self.done.add(prompt_index)
        self.n_tokens_written += n
        self.n_response_written += sum(e - s for s, e in spans)

    def _write(self, tokens, spans, row, prompt_index, sampled, feats, topk_ids, topk_p) -> None:
        n = len(tokens)
        self._append("tokens.bin", np.asarray(tokens, dtype=np.int32))
        if feats is not None:
            assert feats.shape[0] == n
            self._append("feats.bin", feats)
        if topk_ids is not None:
            assert topk_ids.shape[0] == n and topk_p.shape[0] == n
            self._append("topk_ids.bin", topk_ids.astype(np.int32))
            self._append("topk_p.bin", topk_p.astype(np.float16))
        rec = {"prompt_index": prompt_index, "offset": self.offset, "length": n, "spans": spans,
               "response_start": spans[0][0], "category": row.get("category"), "source": row.get("source"),
               "sampled": sampled}
        with open(self.index, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.offset += n


def top_k_probs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[n, V] logits -> ([n, k] ids, [n, k] probabilities at T = 1), most likely first."""
    ids = np.argpartition(logits, -k, axis=1)[:, -k:]
    top = np.take_along_axis(logits, ids, axis=1)
    m = logits.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    order = np.argsort(-top, axis=1)
    return np.take_along_axis(ids, order, axis=1), np.exp(np.take_along_axis(top, order, axis=1) - lse)


def harvest(target: TargetFile, prompts: list[dict], out: Path, settings: HarvestSettings,
            max_tokens: int | None = None, max_seconds: float | None = None, meta_extra: dict | None = None,
            progress: Callable[["DatasetWriter", float], None] | None = None,
            shard: tuple[int, int] = (0, 1), prompt_range: tuple[int, int] | None = None) -> DatasetWriter:
    """Generate responses for `prompts` (skipping those already in `out`) until all are done, the dataset
    holds max_tokens tokens or max_seconds have passed (sequences in flight are then kept as they are).
    shard (i, n): this process takes the prompts whose index is i mod n (n single-threaded processes beat
    one n-threaded one on a busy machine: ggml's threads wait for each other at every op).
    prompt_range [a, b): only these prompt indices (e.g. prompts a drafter being continued has not seen)."""
    from ..native.wrappers import Batch, Context, ContextSettings  # noqa: PLC0415
    model = target.model(settings.n_gpu_layers)
    meta = {"target": target.path.name, "target_arch": model.arch, "taps": list(settings.taps),
            "n_embd": model.n_embd, "seed": settings.seed, "store_features": settings.store_features,
            "top_k_probs": settings.top_k_probs, "feature_dtype": settings.feature_dtype,
            "settings": asdict(settings) | {"chat_template": None}} | (meta_extra or {})
    writer = DatasetWriter(out, meta)
    lo, hi = prompt_range or (0, len(prompts))
    queue = [(i, r) for i, r in enumerate(prompts)
             if lo <= i < hi and i not in writer.done and i % shard[1] == shard[0]]
    n_par = settings.n_parallel
    with contextlib.ExitStack() as stack:      # the context and batch are freed however the harvest ends
        ctx = stack.enter_context(contextlib.closing(Context(model, ContextSettings(
            n_ctx=n_par * settings.ctx_per_seq, n_batch=512, n_ubatch=512, n_threads=settings.n_threads,
            n_seq_max=n_par))))
        ctx.set_taps(settings.taps)
        batch = stack.enter_context(contextlib.closing(Batch(model.native, max(512, n_par))))
        writer.seconds = _Generator(model, ctx, batch, settings, writer, queue).run(max_tokens, max_seconds, progress)
    return writer


class _Generator:
    """n_parallel sequences in one llama.cpp context (one KV stream each); a finished sequence is written and
    its stream takes the next prompt of `queue`."""

    def __init__(self, model, ctx, batch, settings: HarvestSettings, writer: DatasetWriter,
                 queue: list[tuple[int, dict]]):
        self.model, self.ctx, self.batch, self.s, self.writer = model, ctx, batch, settings, writer
        self.K = settings.top_k_probs
        self.queue = queue[::-1]              # pop() from the end takes them in order
        self.slots: dict[int, _Slot] = {}
        self.width = len(settings.taps) * model.n_embd

    def run(self, max_tokens: int | None, max_seconds: float | None, progress) -> float:
        """Until the queue is done or a budget is spent (sequences in flight are then kept); returns seconds."""
        t0 = time.time()

        def spent() -> bool:
            return bool((max_tokens is not None and self.writer.offset >= max_tokens)
                        or (max_seconds is not None and time.time() - t0 >= max_seconds))

        for seq in range(self.s.n_parallel):
            if spent():
                break
            self.start(seq)
        while self.slots and not spent():
            self.step(spent)
            if progress:
                progress(self.writer, time.time() - t0)
        for s in list(self.slots.values()):
            s.spans[-1][1] = len(s.tokens)
            self.finish(s)
        return time.time() - t0

    def prefill(self, slot: _Slot, toks: list[int]) -> None:
        pos0 = len(slot.tokens)
        for i in range(0, len(toks), 512):
            part = toks[i:i + 512]
            self.batch.set_rows(part, range(pos0 + i, pos0 + i + len(part)), [slot.seq] * len(part),
                                 self.ctx.outputs_for_taps("last"))
            self.ctx.decode(self.batch, "harvest prefill")
            if self.s.store_features:
                slot.feats.extend(self.ctx.get_taps(0, len(part)))
        slot.tokens.extend(toks)
        self.keep([slot], self.ctx.logits(len(part) - 1)[None])

    def keep(self, active: list[_Slot], logits: np.ndarray) -> None:
        """Record the target's view of the next position of each slot ([n, V] logits) and pick its token."""
        if self.K:
            ids, p = top_k_probs(logits, self.K)
        for i, slot in enumerate(active):
            if self.K:
                slot.topk_ids.append(ids[i])
                slot.topk_p.append(p[i])
            slot.tokens.append(pick(logits[i], slot.sampling, slot.rng))

    def start(self, seq: int) -> None:
        """Stream `seq` takes the next prompt that fits."""
        s, K = self.s, self.K
        while self.queue:
            index, row = self.queue.pop()
            toks = format_prompt(self.model, row, s.chat_template)
            if not 4 <= len(toks) <= min(768, s.ctx_per_seq // 2):
                continue
            rng = np.random.default_rng([s.seed, index])
            sampled = rng.random() < s.sampled_fraction
            sp = SamplingParams(s.temperature, s.top_k, s.top_p) if sampled else SamplingParams()
            budget = s.max_new.get(row.get("category"), 256)
            slot = _Slot(seq, index, row, [], [], [], [], [], budget, sp, rng, list(row.get("followups", [])))
            slot.topk_ids = [np.full(K, -1, np.int32)] * (len(toks) - 1) if K else []
            slot.topk_p = [np.zeros(K, np.float32)] * (len(toks) - 1) if K else []
            self.prefill(slot, toks)
            slot.spans.append([len(toks), len(toks)])
            self.slots[seq] = slot
            return

    def step(self, spent: Callable[[], bool]) -> None:
        """One token for every active sequence; those that end are written and their streams start anew."""
        active = sorted(self.slots.values(), key=lambda s: s.seq)
        self.batch.set_rows([s.tokens[-1] for s in active], [len(s.tokens) - 1 for s in active],
                            [s.seq for s in active], "all")
        self.ctx.decode(self.batch, "harvest step")
        if self.s.store_features:
            rows = self.ctx.get_taps(0, len(active))
            for i, s in enumerate(active):
                s.feats.append(rows[i])
        self.keep(active, self.ctx.logits_all(len(active)))   # before any prefill below overwrites the outputs
        for s in active:
            written = len(s.tokens) - s.spans[-1][0]
            if (self.model.is_eog(s.tokens[-1]) or written >= s.max_new) and not self.end_turn(s):
                self.finish(s)
                if not spent():
                    self.start(s.seq)

    def end_turn(self, slot: _Slot) -> bool:
        """Close the current answer; open the next user turn if there is one (True: the slot goes on)."""
        model = self.model
        slot.spans[-1][1] = len(slot.tokens)
        if not slot.followups or not model.is_eog(slot.tokens[-1]) or is_completion(slot.row):
            return False
        messages = [{"role": "user", "content": slot.row["prompt"]}]
        for i, (s, e) in enumerate(slot.spans):
            messages.append({"role": "assistant", "content": model.detokenize(slot.tokens[s:e - 1])})
            messages.append({"role": "user", "content": slot.row["followups"][i] if i < len(slot.row["followups"])
                             else ""})
        turn = next_turn_tokens(model, messages, slot.tokens[-1], self.s.chat_template)
        follow = slot.followups.pop(0)
        if not turn or not follow or len(slot.tokens) + len(turn) + 64 > self.s.ctx_per_seq:
            return False
        eog = slot.tokens.pop()           # decoded now, as the first token of the next turn's prefill
        if self.K:
            slot.topk_ids.extend([np.full(self.K, -1, np.int32)] * len(turn))
            slot.topk_p.extend([np.zeros(self.K, np.float32)] * len(turn))
        self.prefill(slot, [eog] + turn)
        slot.spans.append([len(slot.tokens) - 1, len(slot.tokens) - 1])
        return True

    def finish(self, slot: _Slot) -> None:
        K = self.K
        feats = np.vstack(slot.feats + [np.zeros(self.width, np.float32)]) if self.s.store_features else None
        ids = np.vstack(slot.topk_ids + [np.full(K, -1, np.int32)]) if K else None
        p = np.vstack(slot.topk_p + [np.zeros(K, np.float32)]) if K else None
        self.writer.add(slot.tokens, slot.spans, slot.row, prompt_index=slot.prompt_index,
                        sampled=not slot.sampling.greedy, feats=feats, topk_ids=ids, topk_p=p)
        self.ctx.seq_rm(0, -1, seq=slot.seq)
        del self.slots[slot.seq]
