"""safetensors → float32 numpy, without torch: single files or shards (with or without an index)."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from ..errors import UserError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def read_safetensors_file(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (BF16 widened by hand: numpy has no bfloat16)."""
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size < 8:
            raise UserError(f"{path}: not a safetensors file (only {size} bytes); download it again")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
    except (struct.error, ValueError) as e:
        data.close()
        raise UserError(f"{path}: not a safetensors file (bad header: {e}); download it again") from e
    base = 8 + n
    try:
        return {name: _tensor(path, data, base, size, name, meta) for name, meta in header.items()
                if name != "__metadata__"}
    finally:
        data.close()


def _tensor(path: Path, data, base: int, size: int, name: str, meta: dict) -> np.ndarray:
    dtype = _DTYPES.get(meta["dtype"])
    if dtype is None:
        raise UserError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
    start, end = meta["data_offsets"]
    if base + end > size:
        raise UserError(f"{path}: tensor {name} runs past the end of the file; the file is truncated")
    raw = np.frombuffer(data, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize, offset=base + start)
    if meta["dtype"] == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(meta["shape"])
    return raw.astype(np.float32).reshape(meta["shape"])          # a copy: the map can close


def read_safetensors_folder(folder: Path) -> dict[str, np.ndarray]:
    """All weights of a checkpoint folder; shards listed by model.safetensors.index.json when present."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise UserError(f"{index}: not a safetensors index ({e})") from e
        files = [folder / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UserError(f"{folder}: shards {missing} listed in {index.name} are missing; download them")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"{folder}: no *.safetensors weights")
    out = {}
    for f in files:
        for k, v in read_safetensors_file(f).items():
            out[k.removeprefix("model.")] = v
    return out
