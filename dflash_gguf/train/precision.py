"""Which precision the trainer computes in: bf16 autocast only where the hardware does bf16 natively.

CPUs without AVX512_BF16 / AMX emulate bf16 matmuls (measured on an AVX2-only EPYC with torch 2.13: a
1536x576 by 576x4096 product with its backward, 0.18 s in fp32 vs 5.77 s under bf16 autocast), so they train
in fp32. DFLASH_GGUF_TRAIN_PRECISION=fp32|bf16 overrides the choice.
"""

from __future__ import annotations

import os
from pathlib import Path

NATIVE_BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def autocast_dtype_name(device_type: str, flags: set[str] | None = None, cuda_bf16: bool | None = None,
                        override: str | None = None) -> str | None:
    """'bfloat16' to autocast, or None to train in fp32."""
    override = override if override is not None else os.environ.get("DFLASH_GGUF_TRAIN_PRECISION")
    if override:
        if override not in ("fp32", "bf16"):
            raise ValueError(f"DFLASH_GGUF_TRAIN_PRECISION={override!r}: use fp32 or bf16")
        return "bfloat16" if override == "bf16" else None
    if device_type == "cuda":
        return "bfloat16" if cuda_bf16 else None
    return "bfloat16" if (cpu_flags() if flags is None else flags) & NATIVE_BF16_CPU_FLAGS else None
