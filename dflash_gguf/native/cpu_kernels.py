"""Which instruction-set variant of our CPU kernels (ggml-kernels/cpu) runs, and switching it.

The kernels are compiled for AVX2, for AVX-VNNI (AVX2 with 256-bit VNNI dot steps: Intel's cores without AVX-512
since Alder Lake) and for AVX-512; ggml-cpu picks the best one the CPU runs, or the one the environment variable
DFLASH_CPU_ISA names. Switching lets an AVX-512 machine run (and test) exactly what AVX2-only machines run. "none"
sends every product back to ggml's own paths, the ones whose summation order depends on the batch width (tinyBLAS,
the repacked 4-column gemm) included.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from .lib import NativeLibrary, libname

ISAS = ("avx512", "avxvnni", "avx2", "none")


class CpuKernels:
    def __init__(self, native: NativeLibrary):
        cpu = ctypes.CDLL(str(Path(native.lib_dir) / libname("ggml-cpu")))
        self._get = getattr(cpu, "dflash_cpu_isa", None)
        self._set = getattr(cpu, "dflash_cpu_set_isa", None)
        self._invariant = getattr(cpu, "dflash_cpu_batch_invariant", None)
        self._one_order = getattr(cpu, "dflash_cpu_flash_attn_one_order", None)
        self._wide_k = getattr(cpu, "dflash_cpu_wide_k_tiles", None)
        self._set_wide_k = getattr(cpu, "dflash_cpu_set_wide_k_tiles", None)
        if self._wide_k is not None:
            self._wide_k.argtypes, self._wide_k.restype = [], ctypes.c_bool
            self._set_wide_k.argtypes, self._set_wide_k.restype = [ctypes.c_int], None
        if self._get is not None:
            self._get.argtypes, self._get.restype = [], ctypes.c_char_p
            self._set.argtypes, self._set.restype = [ctypes.c_char_p], ctypes.c_bool
        for f in (self._invariant, self._one_order):
            if f is not None:
                f.argtypes, f.restype = [], ctypes.c_bool

    @property
    def isa(self) -> str:
        """The variant in use: "avx512", "avxvnni", "avx2" or "none" (also for a build without our kernels)."""
        return self._get().decode() if self._get is not None else "none"

    @property
    def batch_invariant(self) -> bool:
        """Whether every weight type multiplies in one summation order for every batch width (our kernels
        where they cover the type, ggml's width-independent paths elsewhere); off only after "none"."""
        return bool(self._invariant()) if self._invariant is not None else False

    @property
    def flash_attn_one_order(self) -> bool:
        """Whether flash attention over F16/F32 K and V computes each query row in one summation order for any
        number of rows (patches/0012; off after "none", where ggml's tiled kernel takes 64 rows and more)."""
        return bool(self._one_order()) if self._one_order is not None else False

    @property
    def wide_k_tiles(self) -> bool:
        """Whether the AVX-512 variant steps the K-quants' tiles two at a time from 4 columns (gemm.h: on where the
        core runs 512-bit dot steps at full rate, or as DFLASH_CPU_WIDE_K_TILES says). The bits are the same."""
        return bool(self._wide_k()) if self._wide_k is not None else False

    def set_wide_k_tiles(self, on: bool | None) -> None:
        """Decide wide_k_tiles (None: as chosen at first use)."""
        if self._set_wide_k is not None:
            self._set_wide_k(-1 if on is None else int(on))

    def variants(self, k_tiled: bool) -> list[tuple[str, bool | None]]:
        """(variant, wide_k_tiles) pairs that cover every path this CPU runs, for weights of a K-quant type (k_tiled)
        or not: the AVX-512 variant steps K-quant tiles two at a time on some cores only, so both ways there; None
        leaves wide_k_tiles as it is (no other variant or type reads it)."""
        return [(isa, wide) for isa in self.runnable() if isa != "none"
                for wide in ((False, True) if isa == "avx512" and k_tiled else (None,))]

    def set_isa(self, isa: str) -> bool:
        """Switch to `isa` ("auto" = the best this CPU runs); False when this CPU cannot run it."""
        if self._get is None:
            return isa in ("none", "auto")
        return bool(self._set(isa.encode()))

    def runnable(self) -> list[str]:
        """The variants this CPU runs, best first (the current choice is kept)."""
        current = "auto" if self.isa == "none" and self.batch_invariant else self.isa   # "none" by default
        out = [isa for isa in ISAS if self.set_isa(isa)]
        self.set_isa(current)
        return out
