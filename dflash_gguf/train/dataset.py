"""Anchor blocks from a harvested dataset (see harvest.py for the layout), packed for one forward pass.

One sequence gives many blocks: for each anchor position a in a target-written span, the block
[token@a, MASK×(B-1)] at positions a..a+B-1 must predict tokens a+1..a+B-1, seeing the context
features of positions < a only (exactly what the drafter has at inference: the anchor is the
newest token, not yet decoded by the target), bidirectional inside its block, blind to other blocks.
The whole block lies inside one span: tokens of a user turn are never labels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import features as fx


@dataclass
class PackedBlocks:
    block_tokens: np.ndarray      # [S] int64: anchor token then MASK, per block
    block_pos: np.ndarray         # [S] positions a..a+B-1
    labels: np.ndarray            # [S] target token per row (-100 on anchor rows)
    slot: np.ndarray              # [S] 0..B-1
    ctx_feats: np.ndarray         # [C, k*H] float32 features of positions 0..C-1
    mask: np.ndarray              # [S, C+S] bool: True = may attend
    teacher_ids: np.ndarray | None = None     # [S, K] the target's top-K for each row's label (-1: none)
    teacher_p: np.ndarray | None = None       # [S, K] their probabilities


def spans_of(record: dict) -> list[list[int]]:
    """Target-written [start, end) ranges of a sequence (datasets before multi-turn had one)."""
    return record.get("spans") or [[record["response_start"], record["length"]]]


class FeatureDataset:
    def __init__(self, root: Path):
        self.root = root
        self.meta = json.loads((root / "meta.json").read_text())
        self.taps = self.meta["taps"]
        self.top_k = int(self.meta.get("top_k_probs", 0))
        self.feature_dtype = self.meta.get("feature_dtype", "float16")
        self.refresh()

    def refresh(self) -> int:
        """(Re)read the sequences written so far (a harvest may still be adding to the folder); returns
        how many there are. Only sequences listed in the index are used, so a partly written tail is ignored."""
        index = [json.loads(line) for line in (self.root / "index.jsonl").read_text().splitlines() if line.strip()]
        n = index[-1]["offset"] + index[-1]["length"] if index else 0
        width = len(self.taps) * self.meta["n_embd"]
        self.tokens = np.memmap(self.root / "tokens.bin", dtype=np.int32, mode="r", shape=(n,))
        feats = self.root / "feats.bin"
        if not feats.exists() or feats.stat().st_size < n * width * fx.BYTES[self.feature_dtype]:
            raise ValueError(f"{self.root}: features missing for some sequences; recompute them "
                             "(dflash_gguf.train.refeature) or harvest with features")
        self.feats = np.memmap(feats, dtype=fx.storage_dtype(self.feature_dtype), mode="r", shape=(n, width))
        if self.top_k:
            self.topk_ids = np.memmap(self.root / "topk_ids.bin", dtype=np.int32, mode="r", shape=(n, self.top_k))
            self.topk_p = np.memmap(self.root / "topk_p.bin", dtype=np.float16, mode="r", shape=(n, self.top_k))
        self.index = index
        return len(index)

    def n_rows(self) -> int:
        """Token rows of the sequences in the index."""
        return len(self.tokens)

    def features(self, start: int, stop: int) -> np.ndarray:
        """float32 features of dataset rows start..stop-1."""
        return fx.decode(self.feats[start:stop], self.feature_dtype)

    def written_tokens(self, ids: list[int] | None = None) -> np.ndarray:
        """The target-written tokens of the given sequences (all by default), concatenated."""
        parts = [np.asarray(self.tokens[r["offset"] + s:r["offset"] + e])
                 for r in (self.index if ids is None else [self.index[i] for i in ids]) for s, e in spans_of(r)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def vocabulary(self) -> np.ndarray:
        """Sorted distinct token ids in the data."""
        return np.unique(np.asarray(self.tokens))

    def split(self, every: int = 20) -> tuple[list[int], list[int]]:
        """(train, validation) sequence ids: every `every`-th sequence is held out."""
        ids = list(range(len(self.index)))
        return [i for i in ids if i % every], [i for i in ids if i % every == 0]

    def n_tokens(self, ids: list[int]) -> int:
        return sum(e - s for i in ids for s, e in spans_of(self.index[i]))

    def blocks(self, seq: int, n_anchors: int, block_size: int, mask_token: int, rng: np.random.Generator,
               short_share: float = 0.0) -> PackedBlocks | None:
        """Blocks at random anchors of one sequence. A share `short_share` of them is cut to 2..B-1 rows
        (the rows past the cut are neither seen nor labelled): on CPUs the engine drafts n tokens with n+1
        rows, and a drafter that only ever saw whole blocks proposes a little worse there."""
        r = self.index[seq]
        length = r["length"]
        candidates = np.concatenate([np.arange(s, min(e, length) - block_size + 1) for s, e in spans_of(r)])
        if len(candidates) == 0:                         # no block fits inside a span
            return None
        anchors = np.sort(rng.choice(candidates, size=min(n_anchors, len(candidates)), replace=False))
        rows = np.full(len(anchors), block_size)
        if short_share > 0 and block_size > 2:
            cut = rng.random(len(anchors)) < short_share
            rows[cut] = rng.integers(2, block_size, size=int(cut.sum()))
        return self._pack(r, anchors, rows, block_size, mask_token, hide_past=True)

    def walk_anchors(self, seq: int) -> list[np.ndarray]:
        """Per target-written span, every anchor a drafter could be asked at: its start .. end-2 (the last
        token of a span has nothing left to draft)."""
        r = self.index[seq]
        return [np.arange(s, min(e, r["length"]) - 1) for s, e in spans_of(r) if min(e, r["length"]) - s >= 2]

    def anchor_blocks(self, seq: int, anchors: np.ndarray, block_size: int, mask_token: int) -> PackedBlocks:
        """Blocks at the given anchors of one span; labels stop at the span's end (-100 past it), as a
        drafter near the end of an answer has fewer tokens to get right."""
        r = self.index[seq]
        end = next(min(e, r["length"]) for s, e in spans_of(r) if s <= anchors[0] < e)
        return self._pack(r, anchors, np.minimum(block_size, end - anchors), block_size, mask_token)

    def _pack(self, r: dict, anchors: np.ndarray, valid: np.ndarray, block_size: int, mask_token: int,
              hide_past: bool = False) -> PackedBlocks:
        """anchors [A] sorted; valid [A]: rows of each block with a label (the anchor row included);
        hide_past: rows past `valid` are also invisible to the block (a shorter block, not a cut label)."""
        off, length = r["offset"], r["length"]
        toks = np.asarray(self.tokens[off:off + length], dtype=np.int64)
        A, B = len(anchors), block_size
        slot = np.tile(np.arange(B), A)
        pos = (anchors[:, None] + np.arange(B)).reshape(-1)
        labelled = (slot > 0) & (slot < np.repeat(valid, B))
        inside = np.minimum(pos, length - 1)
        block_tokens = np.where(slot == 0, toks[inside], mask_token)
        labels = np.where(labelled, toks[inside], -100)
        C = int(anchors.max())                           # context rows any block can see
        ctx_visible = np.arange(C)[None, :] < anchors[:, None]                   # [A, C]
        blk = np.arange(A * B) // B
        own = blk[:, None] == blk[None, :]
        if hide_past:
            own &= (slot < np.repeat(valid, B))[None, :]
        mask = np.concatenate([ctx_visible[blk], own], axis=1)
        teacher_ids = teacher_p = None
        if self.top_k:                                   # the distribution of the token at p was kept at p - 1
            teacher_ids = np.asarray(self.topk_ids[off + inside - 1])
            teacher_p = np.asarray(self.topk_p[off + inside - 1], dtype=np.float32)
        return PackedBlocks(block_tokens, pos, labels, slot, self.features(off, off + C), mask,
                            teacher_ids, teacher_p)
