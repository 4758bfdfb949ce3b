#!/usr/bin/env python3
"""Would context entries that carry the tokens before them let the drafter copy? A torch-only probe.

The shipped drafter's context keys and values are one fixed map of the target's tapped features per position, so
block slot m can find "m - 1 positions after where the anchor occurred" only through what those features say about
earlier tokens (docs/learning.md, "Can it learn to copy at all?"). This probe adds to each context position i the
embeddings of tokens i, i-1, ..., i-D+1 (the target's frozen embedding, one shared down-projection to a small rank
and one up-projection per offset, started at zero so the start is the shipped drafter), then continues the drafter
on an adapt work dir's data (lab/copy_task.py's: requests whose answers repeat the prompt, and the replay) with and
without them, the same rows and schedule, and compares acceptance at copy anchors of held-out recorded requests:
teacher-forced, every anchor of each answer, accepted = the drafts matching the target's tokens before the first
miss (up to 7). Nothing here changes the product: the drafter format has no such entries.

  .venv/bin/python lab/copy_context_probe.py --data /tmp/copy/adapted.work/data --rows 250000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.assets import shipped_drafter_for  # noqa: E402
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402
from dflash_gguf.target_file import TargetFile  # noqa: E402
from lab.copy_anchors import copy_match, gram_starts  # noqa: E402

_CTX_TOKENS = {}     # the context tokens of the pack being run (set around each forward)


def history_module(embed, hidden: int, depth: int, rank: int, scale: float):
    import torch
    from torch import nn

    class History(nn.Module):
        """scale * sum over d < depth of up_d(down(E[t_{i-d}])) for each context position i (scale: how much faster
        than the drafter's own weights these move under the same learning rate)."""

        def __init__(self):
            super().__init__()
            self.embed = embed                                   # frozen [V, H]
            self.down = nn.Linear(hidden, rank, bias=False)
            self.up = nn.ModuleList(nn.Linear(rank, hidden, bias=False) for _ in range(depth))
            for up in self.up:
                nn.init.zeros_(up.weight)

        def forward(self, tokens):
            e = self.down(self.embed[tokens])                    # [C, r]
            out = torch.zeros(len(tokens), hidden, device=e.device)
            for d, up in enumerate(self.up):
                shifted = torch.cat([torch.zeros(d, e.shape[1], device=e.device), e[:len(tokens) - d]])
                out = out + up(shifted)
            return out * scale
    return History()


def patch_drafter_forward() -> None:
    """DFlashDrafter.forward with the history added to the fused context (when the model has one)."""
    from dflash_gguf.drafter import torch_ref

    def forward(self, block_emb, ctx_feats, block_pos, ctx_pos, mask=None):
        g = self.hidden_norm(self.fc(ctx_feats))
        hist = getattr(self, "history", None)
        if hist is not None:
            g = g + hist(_CTX_TOKENS["t"])[None]
        x = block_emb * self.config.embedding_scale if self.config.embedding_scale else block_emb
        for i, layer in enumerate(self.layers):
            m = mask if mask is not None else self.inference_mask(block_pos, ctx_pos, self.config.is_sliding(i))
            x = layer(x, g, block_pos, ctx_pos, m)
        return self.norm(x)
    torch_ref.DFlashDrafter.forward = forward


def patch_packing() -> None:
    """PackedBlocks carry their context's tokens (positions 0..C-1 of the sequence)."""
    from dflash_gguf.train.dataset import FeatureDataset
    original = FeatureDataset._pack

    def pack(self, r, anchors, valid, block_size, mask_token, hide_past=False):
        pb = original(self, r, anchors, valid, block_size, mask_token, hide_past)
        pb.ctx_tokens = np.asarray(self.tokens[r["offset"]:r["offset"] + int(anchors.max())], dtype=np.int64)
        return pb
    FeatureDataset._pack = pack


def trainer_for(data, rows: int, lr: float, with_history: bool, depth: int, rank: int, scale: float):
    import torch

    from dflash_gguf.train.adapt import AdaptSettings, continued_trainer
    from dflash_gguf.train.pipeline import read_drafter
    target = TargetFile(smollm2_q4_1())
    src = read_drafter(shipped_drafter_for(target.path), target)
    s = AdaptSettings(lr=lr, rows=rows, threads=2)
    trainer = continued_trainer(target, src, "shipped", data, s)
    trainer.s.schedule_seconds = 10**9           # the schedule by rows
    if with_history:
        trainer.model.history = history_module(trainer.embed, trainer.config.hidden_size, depth, rank, scale)
    trainer.opt = torch.optim.AdamW(trainer.model.parameters(), lr=lr, weight_decay=trainer.s.weight_decay,
                                    betas=(0.9, 0.95))
    original = trainer.forward

    def forward(pb, *args, **kwargs):
        _CTX_TOKENS["t"] = torch.as_tensor(pb.ctx_tokens)
        return original(pb, *args, **kwargs)
    trainer.forward = forward
    return trainer


def held_out(data, share: int) -> tuple[list[int], list[int]]:
    """(training ids, held-out recorded ids): every share-th recorded sequence is held out."""
    recorded = [i for i, r in enumerate(data.index) if r.get("category") == "recorded"]
    held = set(recorded[::share])
    return [i for i in range(len(data.index)) if i not in held], sorted(held)


def acceptance(trainer, data, ids: list[int]) -> dict:
    """{'copy' | 'other': (anchors, mean accepted, a copier's mean)} over every anchor of the held-out answers."""
    import torch
    out: dict = {"copy": [], "other": []}
    B = trainer.config.block_size
    with torch.no_grad():
        for seq in ids:
            r = data.index[seq]
            toks = np.asarray(data.tokens[r["offset"]:r["offset"] + r["length"]]).tolist()
            start = r["response_start"]
            prompt = toks[:start]
            starts = gram_starts(prompt)
            for anchors in data.walk_anchors(seq):
                for chunk in np.array_split(anchors, max(1, len(anchors) // 48)):
                    pb = data.anchor_blocks(seq, chunk, B, trainer.config.mask_token_id)
                    logits, labels, slots = trainer.forward(pb)
                    hit = (logits.argmax(-1) == labels).cpu().numpy().reshape(len(chunk), B - 1)
                    valid = (pb.labels[pb.slot > 0] >= 0).reshape(len(chunk), B - 1)   # a label out of the
                    # draft vocabulary is a miss, not a cut block
                    for a, h, v in zip(chunk, hit, valid):
                        n = int(v.sum())
                        if n < B - 1:            # a block cut by the answer's end: not a full block
                            continue
                        k = int(np.argmin(h)) if not h.all() else n
                        copier = copy_match(prompt, starts, toks, int(a), n)
                        out["copy" if copier else "other"].append((k, copier))
    return {kind: (len(v), float(np.mean([k for k, _ in v])), float(np.mean([c for _, c in v])))
            for kind, v in out.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="an adapt work dir's data folder")
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--depth", type=int, default=8, help="tokens each context entry carries (i, i-1, ...)")
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--scale", type=float, default=1.0, help="the history's output times this")
    ap.add_argument("--hold-every", type=int, default=5, help="every n-th recorded sequence is held out")
    ap.add_argument("--arms", default="plain,history")
    ap.add_argument("--out", type=Path, help="results as JSON")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(2)
    from dflash_gguf.train.dataset import FeatureDataset
    patch_packing()
    patch_drafter_forward()
    data = FeatureDataset(a.data)
    train_ids, held = held_out(data, a.hold_every)
    if not held:
        raise SystemExit(f"{a.data}: no recorded requests to hold out (an adapt work dir's data folder?)")
    results = {}
    for arm in a.arms.split(","):
        trainer = trainer_for(data, a.rows, a.lr, arm == "history", a.depth, a.rank, a.scale)
        trainer.train_ids = train_ids
        before = acceptance(trainer, data, held) if arm == "plain" else None
        trainer.train(Path("/tmp") / f"copy-context-probe-{arm}", progress=False)
        after = acceptance(trainer, data, held)
        results[arm] = {"before": before, "after": after, "rows": trainer.rows_seen, "steps": trainer.step}
        print(arm, json.dumps(results[arm]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
