"""llama.cpp's own quantizer: K-quants (gguf-py can only dequantize them) and precision copies of targets; ggml's
quantizer of one matrix's rows."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from ..errors import UserError

# llama_ftype values (include/llama.h)
FTYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_m": 12,
          "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25, "iq3_s": 26, "iq4_xs": 30, "bf16": 32}


def llama_quantize(src: Path, dst: Path, ftype: str, *, allow_requantize: bool = False, n_threads: int = 0) -> Path:
    """Write `src` at `ftype` to `dst` through a sibling temp file; nothing is left behind on failure."""
    if ftype not in FTYPES:
        raise UserError(f"unknown precision {ftype!r}; choose one of {', '.join(FTYPES)}")
    from .lib import load  # noqa: PLC0415
    L = load().llama_cpp
    params = L.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = allow_requantize
    params.nthread = n_threads
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.q")
    rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{src}: quantizing to {ftype} failed (llama_model_quantize returned {rc})")
    os.replace(tmp, dst)
    return dst


_ROWS = {"ggml_row_size": ([ctypes.c_int, ctypes.c_int64], ctypes.c_size_t),
         "ggml_quantize_chunk": ([ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_int64, ctypes.c_void_p], ctypes.c_size_t),
         "ggml_quantize_requires_imatrix": ([ctypes.c_int], ctypes.c_bool)}


def quantize_rows(ggml_type: int, w: np.ndarray, ggml_base: ctypes.CDLL | None = None) -> np.ndarray:
    """ggml's own quantization of float32 [rows, k] to a ggml type id: uint8 [rows, row bytes]. The types ggml will
    not quantize without an importance matrix get a flat one (every column alike)."""
    from .lib import bind, load  # noqa: PLC0415
    base = bind(ggml_base if ggml_base is not None else load().ggml_base, _ROWS)
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows, k = w.shape
    out = np.empty((rows, base.ggml_row_size(ggml_type, k)), np.uint8)
    flat = np.ones(k, np.float32) if base.ggml_quantize_requires_imatrix(ggml_type) else None
    base.ggml_quantize_chunk(ggml_type, w.ctypes.data, out.ctypes.data, 0, rows, k,
                             None if flat is None else flat.ctypes.data)
    return out
