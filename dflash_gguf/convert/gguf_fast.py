"""A fast little-endian GGUF reader with the part of gguf-py's GGUFReader API convert uses.

gguf-py builds one numpy array per metadata string: 5.5 s for SmolLM2's 49k-token vocabulary on our
CI machine kind, several times that for 150k-token targets. Here string arrays are decoded in one loop
and numeric arrays are single numpy views, so reading a target header takes well under a second.
Tensor data stays memory-mapped, laid out exactly as GGUFReader lays it out (gguf.quants.dequantize
accepts it). Big-endian files fall back to gguf-py.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# GGUFValueType → (struct format, numpy dtype) for the fixed-size types
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


@dataclass
class Field:
    value: Any
    types: list                     # [GGUFValueType] or [ARRAY, element GGUFValueType], like ReaderField.types

    def contents(self) -> Any:
        return self.value


@dataclass
class Tensor:
    name: str
    tensor_type: Any                # gguf.GGMLQuantizationType
    shape: tuple[int, ...]          # ggml ne order (innermost first), like ReaderTensor.shape
    n_elements: int
    data: np.ndarray                # plain types: typed, numpy order; quantized: uint8 rows of blocks


class FastGGUFReader:
    def __init__(self, path: str | Path):
        import gguf  # noqa: PLC0415
        self._gguf = gguf
        with open(path, "rb") as f:
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        if self._buf[:4] != b"GGUF":
            raise ValueError("bad magic (not a GGUF file)")
        self._pos = 4
        (version,) = self._unpack("<I")
        if version > 0xFFFF:
            raise ValueError("big-endian GGUF")
        n_tensors, n_kv = self._unpack("<QQ")
        self.fields: dict[str, Field] = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            self.fields[key] = self._value(vtype)
        infos = [self._tensor_info() for _ in range(n_tensors)]
        align = int(self.fields["general.alignment"].value) if "general.alignment" in self.fields else 32
        start = -(-self._pos // align) * align
        self.tensors = [self._tensor(start, *info) for info in infos]

    def _unpack(self, fmt: str) -> tuple:
        out = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return out

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        s = self._buf[self._pos:self._pos + n].decode("utf-8")
        self._pos += n
        return s

    def _value(self, vtype: int) -> Field:
        VT = self._gguf.GGUFValueType
        if vtype == _STRING:
            return Field(self._string(), [VT.STRING])
        if vtype in _SCALARS:
            return Field(self._unpack(_SCALARS[vtype][0])[0], [VT(vtype)])
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        sub, n = self._unpack("<IQ")
        if sub == _STRING:
            return Field([self._string() for _ in range(n)], [VT.ARRAY, VT.STRING])
        if sub not in _SCALARS:
            raise ValueError(f"unsupported GGUF array element type {sub}")
        dtype = np.dtype(_SCALARS[sub][1])
        arr = np.frombuffer(self._buf, dtype=dtype, count=n, offset=self._pos)
        self._pos += n * dtype.itemsize
        return Field(arr.tolist(), [VT.ARRAY, VT(sub)])

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        (n_dims,) = self._unpack("<I")
        dims = self._unpack(f"<{n_dims}Q")
        ttype, offset = self._unpack("<IQ")
        return name, tuple(int(d) for d in dims), ttype, offset

    def _tensor(self, start: int, name: str, dims: tuple[int, ...], ttype: int, offset: int) -> Tensor:
        g = self._gguf
        qtype = g.GGMLQuantizationType(ttype)
        n = int(np.prod(dims)) if dims else 1
        np_dims = tuple(reversed(dims))
        block, type_size = g.GGML_QUANT_SIZES[qtype]
        if qtype.name in _PLAIN:
            data = np.frombuffer(self._buf, dtype=_PLAIN[qtype.name], count=n, offset=start + offset)
        else:
            data = np.frombuffer(self._buf, dtype=np.uint8, count=n * type_size // block, offset=start + offset)
            np_dims = g.quants.quant_shape_to_byte_shape(np_dims, qtype)
        return Tensor(name, qtype, dims, n, data.reshape(np_dims))


def open_gguf(path: str | Path):
    """FastGGUFReader, or gguf-py's GGUFReader for the files it does not handle (big-endian)."""
    try:
        return FastGGUFReader(path)
    except ValueError as e:
        if "big-endian" not in str(e):
            raise
        import gguf  # noqa: PLC0415
        return gguf.GGUFReader(str(path))
