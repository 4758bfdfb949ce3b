"""A reduced draft vocabulary: the drafter carries the K rows of the target's LM head it may propose.

A drafter's cost is dominated by its LM head (SmolLM2-135M: 28 M of the drafter's 37 M weights), and
every block row goes through it. Upstream's `dflash` graph supports a drafter with its own head of K
rows plus a `d2t` tensor mapping row i to target token d2t[i]; the other logits are -inf. The rows are
copied byte for byte from the target's head (same quantization), so a drafted token's logit is exactly
what the full head would give, and speculation stays lossless: the target verifies every token, and at
T>0 rejection sampling handles q = 0 outside the vocabulary. Tokens are chosen by how often the target
itself writes them (counts from its own responses), always keeping the end-of-generation tokens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..target_file import TargetFile


@dataclass
class DraftVocab:
    token_ids: np.ndarray          # int64 [K], ascending target token ids (the GGUF's d2t)
    head_rows: np.ndarray          # the target head's rows for them: raw quantized bytes [K, row_bytes] or float
    head_type: object              # gguf.GGMLQuantizationType of head_rows

    @property
    def size(self) -> int:
        return int(self.token_ids.size)


def choose_tokens(counts: np.ndarray, k: int, keep: list[int] = ()) -> np.ndarray:
    """The `k` most frequent token ids (ties: lower id first), plus `keep`, ascending."""
    n_vocab = counts.size
    if not 0 < k <= n_vocab:
        raise UserError(f"--draft-vocab {k}: choose between 1 and the target's {n_vocab} tokens")
    keep = sorted({int(t) for t in keep if 0 <= int(t) < n_vocab})
    order = np.lexsort((np.arange(n_vocab), -counts))          # by count descending, then id
    chosen = set(keep)
    for t in order:
        if len(chosen) >= max(k, len(keep)):
            break
        chosen.add(int(t))
    return np.array(sorted(chosen), dtype=np.int64)


def target_head_rows(target: TargetFile, token_ids: np.ndarray) -> tuple[np.ndarray, object]:
    """Rows `token_ids` of the target's LM head (its token embedding when tied), in the target's own type."""
    t = target.tensors.get("output.weight") or target.tensors.get("token_embd.weight")
    if t is None:
        raise UserError(f"{target.path}: no output.weight or token_embd.weight tensor; cannot build a draft vocabulary")
    rows = np.asarray(t.data)
    n_rows = int(t.shape[1])
    if rows.shape[0] != n_rows:
        raise UserError(f"{target.path}: unexpected layout of {t.name} ({rows.shape}); cannot build a draft vocabulary")
    if token_ids.max(initial=-1) >= n_rows:
        raise UserError(f"{target.path}: token id {int(token_ids.max())} is outside its LM head ({n_rows} rows); "
                        "count tokens with this target, not another model")
    return np.ascontiguousarray(rows[token_ids]), t.tensor_type


def build(target: TargetFile, counts: np.ndarray, k: int, keep: list[int]) -> DraftVocab:
    ids = choose_tokens(counts, k, keep)
    rows, qtype = target_head_rows(target, ids)
    return DraftVocab(ids, rows, qtype)


def counted(target: TargetFile, k: int, prompt_files: list[Path], n_prompts: int, seconds: float | None = None,
            n_threads: int = 0) -> DraftVocab:
    """The `k`-token draft vocabulary of `target`, counted on its responses to `n_prompts` prompts."""
    from ..textgen.token_counts import count_target_tokens, load_prompt_rows  # noqa: PLC0415
    counts = count_target_tokens(target, load_prompt_rows(prompt_files)[:n_prompts], seconds=seconds,
                                 n_threads=n_threads)
    vocab = build(target, counts, k, target.eog_ids)
    print(f"draft vocabulary: {vocab.size} tokens cover {coverage(vocab.token_ids, counts):.1%} of the counted "
          "tokens", file=sys.stderr)
    return vocab


def coverage(token_ids: np.ndarray, counts: np.ndarray) -> float:
    """Share of the counted tokens inside the vocabulary."""
    total = counts.sum()
    return float(counts[token_ids].sum() / total) if total else 0.0


def rows_over_vocab(rows: np.ndarray, token_ids: np.ndarray, n_vocab: int) -> np.ndarray:
    """Rows of a draft vocabulary [K, R] (a DSpark W2) → rows over the whole vocabulary [V, R], zero outside:
    the layout our tensor dicts use (the writer takes the draft vocabulary's rows back out)."""
    full = np.zeros((n_vocab, rows.shape[1]), dtype=np.float32)
    full[np.asarray(token_ids, np.int64)] = rows
    return full


def check_d2t(d2t: np.ndarray, n_head_rows: int, n_vocab: int, source: str) -> None:
    """A d2t tensor read from a file: one distinct in-range target id per head row."""
    if d2t.ndim != 1 or d2t.size != n_head_rows:
        raise UserError(f"{source}: d2t has {d2t.size} entries but the drafter's head has {n_head_rows} rows")
    if d2t.size and (d2t.min() < 0 or d2t.max() >= n_vocab):
        raise UserError(f"{source}: d2t maps to token ids outside the target vocabulary (0..{n_vocab - 1})")
    if np.unique(d2t).size != d2t.size:
        raise UserError(f"{source}: d2t maps two head rows to the same token")
