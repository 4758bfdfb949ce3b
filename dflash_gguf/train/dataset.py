"""Anchor blocks from a harvested dataset (see harvest.py for the layout), packed for one forward pass.

One sequence gives many blocks: for each anchor position a in the response, the block
[token@a, MASK×(B-1)] at positions a..a+B-1 must predict tokens a+1..a+B-1, seeing the context
features of positions < a only (exactly what the drafter has at inference: the anchor is the
newest token, not yet decoded by the target), bidirectional inside its block, blind to other blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class PackedBlocks:
    block_tokens: np.ndarray      # [S] int64: anchor token then MASK, per block
    block_pos: np.ndarray         # [S] positions a..a+B-1
    labels: np.ndarray            # [S] target token per row (-100 on anchor rows)
    slot: np.ndarray              # [S] 0..B-1
    ctx_feats: np.ndarray         # [C, k*H] float16 features of positions 0..C-1
    mask: np.ndarray              # [S, C+S] bool: True = may attend


class FeatureDataset:
    def __init__(self, root: Path):
        self.root = root
        self.meta = json.loads((root / "meta.json").read_text())
        self.taps = self.meta["taps"]
        self.refresh()

    def refresh(self) -> int:
        """(Re)read the sequences written so far (a harvest may still be adding to the folder); returns
        how many there are. Only sequences listed in the index are used, so a partly written tail is ignored."""
        index = [json.loads(line) for line in (self.root / "index.jsonl").read_text().splitlines() if line.strip()]
        n = index[-1]["offset"] + index[-1]["length"] if index else 0
        width = len(self.taps) * self.meta["n_embd"]
        self.tokens = np.memmap(self.root / "tokens.bin", dtype=np.int32, mode="r", shape=(n,))
        self.feats = np.memmap(self.root / "feats.bin", dtype=np.float16, mode="r", shape=(n, width))
        self.index = index
        return len(index)

    def vocabulary(self) -> np.ndarray:
        """Sorted distinct token ids in the data."""
        return np.unique(np.asarray(self.tokens))

    def split(self, every: int = 20) -> tuple[list[int], list[int]]:
        """(train, validation) sequence ids: every `every`-th sequence is held out."""
        ids = list(range(len(self.index)))
        return [i for i in ids if i % every], [i for i in ids if i % every == 0]

    def n_tokens(self, ids: list[int]) -> int:
        return sum(self.index[i]["length"] - self.index[i]["response_start"] for i in ids)

    def blocks(self, seq: int, n_anchors: int, block_size: int, mask_token: int, rng: np.random.Generator
               ) -> PackedBlocks | None:
        r = self.index[seq]
        off, length, rs = r["offset"], r["length"], r["response_start"]
        last = length - block_size                       # the block's last label must exist
        if last < rs:
            return None
        candidates = np.arange(rs, last + 1)
        anchors = np.sort(rng.choice(candidates, size=min(n_anchors, len(candidates)), replace=False))
        toks = np.asarray(self.tokens[off:off + length], dtype=np.int64)
        A, B = len(anchors), block_size
        slot = np.tile(np.arange(B), A)
        pos = (anchors[:, None] + np.arange(B)).reshape(-1)
        block_tokens = np.where(slot == 0, toks[pos], mask_token)
        labels = np.where(slot == 0, -100, toks[pos])
        C = int(anchors.max())                           # context rows any block can see
        ctx_visible = np.arange(C)[None, :] < anchors[:, None]                   # [A, C]
        blk = np.arange(A * B) // B
        mask = np.concatenate([ctx_visible[blk], blk[:, None] == blk[None, :]], axis=1)
        return PackedBlocks(block_tokens, pos, labels, slot, np.asarray(self.feats[off:off + C]), mask)
