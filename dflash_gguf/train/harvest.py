"""Training data from the target itself: it writes the responses, and its tapped hidden states for
every position are stored beside the tokens (F16, memory-mapped). Any GGUF target works.

Generation runs several sequences in one batch (CPU batches of 8 cost ~4× one token), and the taps
of each decoded row are kept as they come, so no second pass over the text is needed.

Layout of a dataset folder:
  tokens.bin   int32 [N]            all sequences back to back (prompt + response)
  feats.bin    float16 [N, k*H]     features of each position (the row of the last token is zero)
  index.jsonl  one row per sequence {offset, length, response_start, category, source, sampled}
  meta.json    target, taps, n_embd, settings
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..engine.sampling import SamplingParams, probs_from_logits, sample


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


@dataclass
class _Slot:
    seq: int
    row: dict
    tokens: list[int]
    feats: list[np.ndarray]
    response_start: int
    max_new: int
    sampling: SamplingParams


def format_prompt(model, row: dict) -> list[int]:
    """Code prompts are raw completions; math and chat go through the model's chat template."""
    if row.get("category") == "code" or not model.chat_template():
        return model.tokenize(row["prompt"], add_special=True)
    from ..engine.chat import render_chat  # noqa: PLC0415
    text = render_chat(model.chat_template(), [{"role": "user", "content": row["prompt"]}],
                       bos_token=model.token_bytes(model.bos(), special=True).decode("utf-8", "replace"),
                       eos_token=model.token_bytes(model.eos(), special=True).decode("utf-8", "replace"),
                       model_name=model.path.name)
    return model.tokenize(text, add_special=False)


class DatasetWriter:
    def __init__(self, out: Path, meta: dict):
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        meta_path = out / "meta.json"
        if meta_path.exists():
            old = json.loads(meta_path.read_text())
            if old["taps"] != meta["taps"] or old["target"] != meta["target"]:
                raise ValueError(f"{out} holds data for other taps/target ({old['taps']}, {old['target']})")
        else:
            meta_path.write_text(json.dumps(meta, indent=2))
        self.index = out / "index.jsonl"
        self.n_done = sum(1 for _ in self.index.open()) if self.index.exists() else 0
        self.offset = (out / "tokens.bin").stat().st_size // 4 if (out / "tokens.bin").exists() else 0
        self.n_tokens_written = 0

    def add(self, tokens: list[int], feats: np.ndarray, response_start: int, row: dict, sampled: bool) -> None:
        assert feats.shape[0] == len(tokens)
        with open(self.out / "tokens.bin", "ab") as f:
            f.write(np.asarray(tokens, dtype=np.int32).tobytes())
        with open(self.out / "feats.bin", "ab") as f:
            f.write(feats.astype(np.float16).tobytes())
        rec = {"offset": self.offset, "length": len(tokens), "response_start": response_start,
               "category": row.get("category"), "source": row.get("source"), "sampled": sampled}
        with open(self.index, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.offset += len(tokens)
        self.n_done += 1
        self.n_tokens_written += len(tokens)


def harvest(target_path: Path, prompts: list[dict], out: Path, settings: HarvestSettings,
            max_tokens: int | None = None, progress: Callable[[int, int], None] | None = None) -> DatasetWriter:
    """Generate responses for `prompts` (resuming after those already in `out`) until all are done or
    the dataset holds max_tokens tokens."""
    from ..native.wrappers import Batch, Context, ContextSettings, Model  # noqa: PLC0415

    model = Model(target_path)
    meta = {"target": str(target_path.name), "target_arch": model.arch, "taps": list(settings.taps),
            "n_embd": model.n_embd, "settings": asdict(settings)}
    writer = DatasetWriter(out, meta)
    n_par = settings.n_parallel
    ctx = Context(model, ContextSettings(n_ctx=n_par * settings.ctx_per_seq, n_batch=512, n_ubatch=512,
                                         n_threads=settings.n_threads, n_seq_max=n_par))
    ctx.set_taps(settings.taps)
    batch = Batch(model.native, 512)
    rng = np.random.default_rng(settings.seed + writer.n_done)
    queue = list(enumerate(prompts))[writer.n_done:]
    slots: dict[int, _Slot] = {}
    t0 = time.time()

    def start(seq: int) -> None:
        while queue:
            _, row = queue.pop(0)
            toks = format_prompt(model, row)
            if not 4 <= len(toks) <= min(512, settings.ctx_per_seq // 2):
                continue
            sampled = rng.random() < settings.sampled_fraction
            sp = SamplingParams(settings.temperature, settings.top_k, settings.top_p) if sampled else SamplingParams()
            batch.set_rows(toks, range(len(toks)), [seq] * len(toks), "last")
            ctx.decode(batch, "harvest prefill")
            feats = list(ctx.get_taps(0, len(toks)))
            first = _pick(ctx.logits(len(toks) - 1), sp, rng)
            budget = min(settings.max_new.get(row.get("category"), 256), settings.ctx_per_seq - len(toks) - 1)
            slots[seq] = _Slot(seq, row, toks + [first], feats, len(toks), budget, sp)
            return

    def finish(slot: _Slot) -> None:
        width = slot.feats[0].shape[0]
        feats = np.vstack(slot.feats + [np.zeros(width, np.float32)])      # the last token was never decoded
        writer.add(slot.tokens, feats, slot.response_start, slot.row, not slot.sampling.greedy)
        ctx.seq_rm(0, -1, seq=slot.seq)
        del slots[slot.seq]

    for seq in range(n_par if max_tokens is None or writer.offset < max_tokens else 0):
        start(seq)
    while slots and (max_tokens is None or writer.offset < max_tokens):
        active = sorted(slots.values(), key=lambda s: s.seq)
        batch.set_rows([s.tokens[-1] for s in active], [len(s.tokens) - 1 for s in active],
                       [s.seq for s in active], "all")
        ctx.decode(batch, "harvest step")
        rows = ctx.get_taps(0, len(active))
        picks = [_pick(ctx.logits(i), s.sampling, rng) for i, s in enumerate(active)]
        for i, s in enumerate(active):       # prefills of new prompts below overwrite the step's outputs
            s.feats.append(rows[i])
            s.tokens.append(picks[i])
            if model.is_eog(picks[i]) or len(s.tokens) - s.response_start >= s.max_new:
                finish(s)
                start(s.seq)
        if progress:
            progress(writer.n_done, writer.n_tokens_written)
    for s in list(slots.values()):      # stopped by max_tokens: keep what was generated
        finish(s)
    writer.seconds = time.time() - t0
    ctx.close()
    model.close()
    return writer


def _pick(logits: np.ndarray, sp: SamplingParams, rng) -> int:
    if sp.greedy:
        return int(np.argmax(logits))
    return sample(probs_from_logits(logits, sp), rng)
