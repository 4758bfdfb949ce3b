"""A fast little-endian GGUF reader with the part of gguf-py's GGUFReader API convert and the engine use.

gguf-py builds one numpy array per metadata string: 5.5 s for SmolLM2's 49k-token vocabulary on our
CI machine kind, several times that for 150k-token targets. Here string arrays are decoded in one loop
and numeric arrays are single numpy views, so reading a target header takes well under a second.
The header is parsed and validated once, by `gguf_check.parse_header` (shared by every command); tensor
data stays memory-mapped, laid out exactly as GGUFReader lays it out (gguf.quants.dequantize accepts it).
Big-endian files fall back to gguf-py.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .gguf_check import BigEndianGGUF, Field, parse_header

_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


@dataclass
class Tensor:
    name: str
    tensor_type: Any                # gguf.GGMLQuantizationType
    shape: tuple[int, ...]          # ggml ne order (innermost first), like ReaderTensor.shape
    n_elements: int
    data: np.ndarray                # plain types: typed, numpy order; quantized: uint8 rows of blocks


class FastGGUFReader:
    """fields + tensors of a GGUF whose header `gguf_check.parse_header` validated (bounds, types, layout)."""

    def __init__(self, path: str | Path):
        import gguf  # noqa: PLC0415
        header = parse_header(path)
        self.fields: dict[str, Field] = header.fields
        with open(path, "rb") as f:
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.tensors = [self._tensor(gguf, header.data_start, t) for t in header.tensors]

    def _tensor(self, g, start: int, t) -> Tensor:
        qtype = g.GGMLQuantizationType(t.ggml_type)
        n = int(np.prod(t.dims))
        np_dims = tuple(reversed(t.dims))
        if qtype.name in _PLAIN:
            data = np.frombuffer(self._buf, dtype=_PLAIN[qtype.name], count=n, offset=start + t.offset)
        else:
            data = np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=start + t.offset)
            np_dims = g.quants.quant_shape_to_byte_shape(np_dims, qtype)
        return Tensor(t.name, qtype, t.dims, n, data.reshape(np_dims))


def open_gguf(path: str | Path):
    """FastGGUFReader, or gguf-py's GGUFReader for the files it does not handle (big-endian)."""
    try:
        return FastGGUFReader(path)
    except BigEndianGGUF:
        import gguf  # noqa: PLC0415
        return gguf.GGUFReader(str(path))
