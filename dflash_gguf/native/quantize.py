"""llama.cpp's own quantizer: K-quants (gguf-py can only dequantize them) and precision copies of targets."""

from __future__ import annotations

import os
from pathlib import Path

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
