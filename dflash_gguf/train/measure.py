"""τ of a drafter on real prompts, measured the way greedy speculative decoding would see it.

The target writes its greedy continuation; then, walking along it, the drafter (llama.cpp `dflash`
graph, fed the target's tapped features of every position before the anchor) drafts a full block
at each anchor, the leading drafts that equal the continuation are accepted, and the next anchor
is the token after them. Greedy verification is lossless, so this is exactly the accepted length
of a greedy speculative run, without depending on any particular decoding loop.

τ = tokens after the first / blocks drafted (accepted + 1 per target call). Code prompts are raw
completions; math and chat go through the target's chat template, as in training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class TauReport:
    by_category: dict[str, float]                 # τ per category (pooled over its prompts)
    prompts: dict[str, int]                       # prompts measured per category
    slot_accept: list[float]                      # P(slot k accepted | slots < k accepted), k = 1..B-1
    per_prompt: list[dict] = field(default_factory=list)

    @property
    def overall(self) -> float:
        calls = sum(p["calls"] for p in self.per_prompt)
        return sum(p["tokens"] - 1 for p in self.per_prompt) / calls if calls else 0.0

    def to_json(self) -> dict:
        return {"tau": {k: round(v, 3) for k, v in self.by_category.items()}, "tau_overall": round(self.overall, 3),
                "prompts": self.prompts,
                "slot_accept": [round(x, 3) for x in self.slot_accept]}


def load_eval_prompts(folder: Path, per_category: int) -> list[dict]:
    """The first `per_category` prompts of each <category>.jsonl in `folder`."""
    rows = []
    for f in sorted(folder.glob("*.jsonl")):
        lines = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
        rows += lines[:per_category]
    return rows


def measure_tau(drafter: Path, target: Path, prompts: list[dict], max_tokens: int = 128,
                n_threads: int = 0) -> TauReport:
    from ..native.wrappers import Batch, Context, ContextSettings, Model  # noqa: PLC0415
    from ..textgen.greedy import greedy_continuation, prefill_features  # noqa: PLC0415
    from ..textgen.prompting import format_prompt  # noqa: PLC0415
    from .acceptance import Walk  # noqa: PLC0415

    tm, dm = Model(target), Model(drafter)
    taps, block, mask = dm.target_layer_ids(), dm.block_size(), dm.mask_token()
    n_ctx = 2048
    tctx = Context(tm, ContextSettings(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=n_threads))
    dctx = Context(dm, ContextSettings(n_ctx=n_ctx, n_batch=64, n_ubatch=64, n_threads=n_threads), other=tctx)
    dctx.set_causal(False)
    tbatch = Batch(tm.native, 512)
    ebatch = Batch(dm.native, 64, len(taps) * tm.n_embd)
    bbatch = Batch(dm.native, block)
    walk = Walk()
    calls: dict[str, int] = {}
    made: dict[str, int] = {}
    per_prompt = []
    try:
        for row in prompts:
            cat = row.get("category", "chat")
            prompt = format_prompt(tm, row)[: n_ctx // 2]
            seq = prompt + greedy_continuation(tm, tctx, tbatch, prompt, min(max_tokens, n_ctx - len(prompt) - block))
            feats = prefill_features(tctx, tbatch, taps, seq)                 # [len(seq), k*H]
            dctx.clear()
            injected, p, n_calls = 0, len(prompt), 0                   # seq[p]: the newest token, not yet verified
            while p < len(seq) - 1:
                for i in range(injected, p, 64):                      # context: every position before p
                    ebatch.set_embd(feats[i:min(p, i + 64)], i, "none")
                    dctx.decode(ebatch, "feature injection")
                injected = p
                bbatch.set_tokens([seq[p]] + [mask] * (block - 1), p, "all")
                dctx.decode(bbatch, "draft")
                drafts = np.asarray(dctx.logits_all(block))[1:].argmax(axis=1)        # slots 1..B-1
                dctx.seq_rm(p, -1)
                n = min(block - 1, len(seq) - 1 - p)
                right = drafts[:n] == np.asarray(seq[p + 1:p + 1 + n])
                k = int(np.cumprod(right).sum())
                walk.block(k, n)
                n_calls += 1
                p += k + 1
            generated = len(seq) - len(prompt)
            calls[cat] = calls.get(cat, 0) + n_calls
            made[cat] = made.get(cat, 0) + generated - 1
            per_prompt.append({"id": row.get("id"), "category": cat, "tokens": generated, "calls": n_calls,
                               "tau": round((generated - 1) / n_calls, 3) if n_calls else None})
    finally:
        for obj in (bbatch, ebatch, tbatch, dctx, tctx, dm, tm):
            obj.close()
    counts = {c: sum(1 for p in per_prompt if p["category"] == c) for c in calls}
    return TauReport({c: made[c] / calls[c] for c in calls if calls[c]}, counts,
                     walk.slot_accept + [0.0] * (block - 1 - len(walk.slot_accept)), per_prompt)

