"""How tapped features are stored: float16 where the target's hidden states fit it, else bfloat16.

Gemma's hidden states exceed float16's ±65504 (Gemma 3 270M: ~1e5 in its deepest taps), so a float16 copy
holds inf and training on it gives a NaN loss. bfloat16 keeps float32's range in the same 2 bytes (8 bits of
mantissa against float16's 11); float32 doubles the dataset. A dataset records its feature dtype in
meta.json ("feature_dtype", absent = float16: the datasets made before) and each tap's range in ranges.json.
numpy has no bfloat16: it is stored as the high 16 bits of float32 (rounded to nearest even) in uint16.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FLOAT16_MAX = 65504.0
# float16 is chosen only with this much headroom over the largest value the range probe saw: later text
# can reach further than a few probe prompts
FLOAT16_HEADROOM = 8.0
BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


class NonFiniteFeatures(ValueError):
    """The target produced inf/NaN hidden states, or values the dataset's dtype cannot hold."""


def choose_dtype(max_abs: float) -> str:
    return "float16" if max_abs * FLOAT16_HEADROOM < FLOAT16_MAX else "bfloat16"


def encode(feats: np.ndarray, dtype: str) -> np.ndarray:
    """float32 [n, w] → the stored array; refuses values that are not finite or do not fit `dtype`."""
    x = np.asarray(feats, dtype=np.float32)
    if not np.isfinite(x).all():
        raise NonFiniteFeatures("the target's tapped hidden states hold inf/NaN")
    if dtype == "float32":
        return x
    if dtype == "float16":
        if np.abs(x).max(initial=0.0) > FLOAT16_MAX:
            raise NonFiniteFeatures(f"a tapped hidden state ({np.abs(x).max():.4g}) exceeds float16's range")
        return x.astype(np.float16)
    bits = x.view(np.uint32)
    rounded = bits + (0x7FFF + ((bits >> 16) & 1))        # round to nearest even (finite inputs only)
    return (rounded >> 16).astype(np.uint16)


def decode(stored: np.ndarray, dtype: str) -> np.ndarray:
    """The stored array → float32."""
    if dtype == "bfloat16":
        return (np.asarray(stored, dtype=np.uint32) << 16).view(np.float32)
    return np.asarray(stored, dtype=np.float32)


def storage_dtype(dtype: str):
    return {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32}[dtype]


def tap_ranges(feats: np.ndarray, n_taps: int) -> list[list[float]]:
    """[min, max] of each tap's block of columns of float32 features [n, k*H]."""
    x = np.asarray(feats, dtype=np.float32).reshape(len(feats), n_taps, -1)
    return [[float(x[:, t].min(initial=np.inf)), float(x[:, t].max(initial=-np.inf))] for t in range(n_taps)]


def merge_ranges(path: Path, ranges: list[list[float]]) -> None:
    """Widen the per-tap ranges kept in `path` (ranges.json) by `ranges` (the caller holds the dataset lock)."""
    old = json.loads(path.read_text()).get("taps") if path.exists() else None
    if old and len(old) == len(ranges):
        ranges = [[min(a[0], b[0]), max(a[1], b[1])] for a, b in zip(old, ranges)]
    path.write_text(json.dumps({"taps": ranges}))
