"""Interleaved weights (gemm.h: dflash_cpu_interleave, patches/0014): Q2_K, Q3_K, Q4_K, Q5_K, Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, IQ4_NL, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M and Q6_K matrices whose rows are a multiple of 8 are
kept, from load, with each block of each tile of 8 rows stored as its 4-byte words (Q8_0's quants as q + 128, Q5_0's and
Q5_1's fifth bits as bit planes, or Q5_0's as masks, of the unpacked lanes), so the kernels read a tile as one stream
with no transposes. The layout must change nothing but speed: through the C entry points, on every instruction-set
variant this CPU runs and with the rows split over threads, the product of the interleaved weights equals the product of
the same weights in ggml's layout bit for bit at every batch width (which tests/test_cpu_kernels.py checks against
float64, ggml's stock path and across widths). Models load through it in every engine test (tests/test_engine.py,
tests/test_exactness.py: SmolLM2 Q4_K_M's Q4_K, Q5_0 and Q8_0 and Q6_K matrices are interleaved; its token embedding is
not)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from dflash_gguf.native.lib import libname
from lab.matmul_probe import GGML_TYPES, MatmulProbe

BATCHES = list(range(1, 17)) + [40]
BLOCKS_OF_32 = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl")   # blocks of 32 weights; the K-quants' of 256
# one fp16 scale, then whole words: the 8 rows' scales lead
SCALE_FIRST = ("q4_0", "q5_0", "q8_0", "iq4_nl", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s")
SCALE_LAST = ("q6_k", "q3_k")                       # whole words, then one fp16 scale: the 8 rows' scales close
Q8_K_BYTES = 292                    # one block_q8_K: its activations' row bytes per 256 values
_P, _I64, _SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
_NEXT_CHUNK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)     # gemm.h: dflash_cpu_next_chunk
_GEMM_ARGS = [ctypes.c_int, _I64, _I64, _I64, _P, _SZ, _P, _SZ, _P, _I64, ctypes.c_int, ctypes.c_int, _NEXT_CHUNK, _P]


@pytest.fixture(scope="module")
def cpu(native):
    lib = ctypes.CDLL(str(Path(native.lib_dir) / libname("ggml-cpu")))
    lib.dflash_cpu_interleave_wanted.argtypes, lib.dflash_cpu_interleave_wanted.restype = [ctypes.c_int, _I64], ctypes.c_bool
    lib.dflash_cpu_interleave.argtypes, lib.dflash_cpu_interleave.restype = [ctypes.c_int, _I64, _SZ, _P, _P], None
    for f in (lib.dflash_cpu_gemm, lib.dflash_cpu_gemm_interleaved):
        f.argtypes, f.restype = _GEMM_ARGS, ctypes.c_bool
    lib.dflash_cpu_quantize_row_q8_K.argtypes, lib.dflash_cpu_quantize_row_q8_K.restype = [_P, _P, _I64], ctypes.c_bool
    lib.dflash_cpu_q5_0_bit_planes.argtypes, lib.dflash_cpu_q5_0_bit_planes.restype = [], ctypes.c_bool
    return lib


def _product(gemm, weight_type: str, weights: np.ndarray, acts: np.ndarray, n_blocks: int, n: int, nth: int,
             claiming: bool = False) -> np.ndarray:
    """[n, n_rows] float32: the first n activation rows (the type's vec_dot_type) times the weights, the rows split
    over nth calls: in equal parts, or (claiming) by chunks taken from a shared counter, as ggml's threads take them
    (the first call takes every chunk left after each call's own first one)."""
    n_rows, row_bytes = weights.shape
    out = np.full((n, n_rows), np.nan, np.float32)
    counter = [nth]

    def next_chunk(_pool):
        counter[0] += 1
        return counter[0] - 1
    claim = _NEXT_CHUNK(next_chunk) if claiming else _NEXT_CHUNK()
    for ith in range(nth):
        assert gemm(GGML_TYPES[weight_type], n_rows, n, n_blocks, weights.ctypes.data, row_bytes, acts.ctypes.data,
                    acts.shape[1], out.ctypes.data, n_rows, ith, nth, claim, None)
    assert counter[0] > nth or not claiming or nth == 1       # chunks past the first ones were claimed
    return out


def _q8_1(x: np.ndarray) -> np.ndarray:
    """x [n, k] as Q8_1 blocks (d, s = d * sum(q), 32 quants): bytes both layouts' kernels read alike"""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=2) / 127
    q = np.round(blocks / np.where(d == 0, 1, d)[..., None]).astype(np.int8)
    out = np.empty(blocks.shape[:2] + (36,), np.uint8)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:4] = (d * q.sum(axis=2)).astype(np.float16)[..., None].view(np.uint8)
    out[..., 4:] = q.view(np.uint8)
    return out.reshape(x.shape[0], -1)


def _activations(native, cpu, weight_type: str, x: np.ndarray) -> np.ndarray:
    """x [n, k] as the weight type's vec_dot_type: Q8_K for the K-quants (our vector steps, ggml's bytes), Q8_1
    for Q4_1 and Q5_1, Q8_0 (ggml's own quantization) for the others"""
    n, k = x.shape
    if weight_type in ("q4_1", "q5_1"):
        return _q8_1(x)
    if weight_type in BLOCKS_OF_32:
        probe = MatmulProbe(native, "q8_0", [(1, k)], [1])
        acts = probe.quantize(x)
        probe.close()
        return acts
    acts = np.empty((n, k // 256 * Q8_K_BYTES), np.uint8)
    for j in range(n):
        assert cpu.dflash_cpu_quantize_row_q8_K(x[j].ctypes.data, acts[j].ctypes.data, k)
    return acts


@pytest.mark.parametrize("weight_type", ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                                         "iq4_nl", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"])
def test_interleaved_weights_give_the_bits_of_ggmls_layout(native, kernels, cpu, weight_type):
    if kernels.isa == "none":
        pytest.skip("our CPU kernels do not run on this CPU")
    rng = np.random.default_rng(23)
    n_rows, k = 200, 768                       # 25 tiles of 8 rows, 3 super-blocks per row
    probe = MatmulProbe(native, weight_type, [(n_rows, k)], [1])
    w = rng.standard_normal((n_rows, k), dtype=np.float32)
    w[:, : k // 2] += 0.5                      # super-blocks with a clearly non-zero min
    raw = probe.quantize(w)
    probe.close()
    kind = GGML_TYPES[weight_type]
    assert cpu.dflash_cpu_interleave_wanted(kind, n_rows)
    assert not cpu.dflash_cpu_interleave_wanted(kind, n_rows - 4)          # a partial tile stays in ggml's layout
    assert not cpu.dflash_cpu_interleave_wanted(GGML_TYPES["tq2_0"], n_rows)   # types without our kernels
    inter = np.empty_like(raw)
    cpu.dflash_cpu_interleave(kind, n_rows, raw.shape[1], raw.ctypes.data, inter.ctypes.data)
    n_blocks = k // (32 if weight_type in BLOCKS_OF_32 else 256)
    block = raw.shape[1] // n_blocks
    flip = 0x80 if weight_type == "q8_0" else 0       # Q8_0's quants stored as q + 128
    if flip:
        quants = np.zeros(raw.shape[1], bool)
        quants[(np.arange(raw.shape[1]) % block) >= 2] = True
        moved = raw.copy()
        moved[:, quants] ^= flip
    else:
        moved = raw
    assert not np.array_equal(inter, raw)
    if weight_type not in ("q5_0", "q5_1"):    # the same bytes in another order (the fifth bits move bit by bit)
        assert np.array_equal(np.sort(inter, axis=None), np.sort(moved, axis=None))
    tile = inter[:8].reshape(-1)
    if weight_type in SCALE_FIRST:
        # the 8 rows' fp16 scales first, then word w of row r at 16 + 32 w + 4 r: the first tile's second block,
        # row 3's scale and its word 2 (bytes 8..11 of its quants; Q5_0's quants open with its 4 bytes of fifth bits)
        assert np.array_equal(tile[8 * block + 2 * 3:][:2], raw[3, block:block + 2])
        w = 3 if weight_type == "q5_0" else 2
        want = raw[3, block + 2 + 4 * w:block + 2 + 4 * w + 4] ^ flip
        assert np.array_equal(tile[8 * block + 16 + 32 * w + 4 * 3:][:4], want)
    else:
        # word w of row r of a tile's block b at 32 w + 4 r: the first tile's second block, row 3, word 4 (Q4_1's
        # last: bytes 12..15 of its quants, after d and m)
        assert np.array_equal(tile[8 * block + 32 * 4 + 4 * 3:][:4], raw[3, block + 16:block + 20])
    if weight_type in SCALE_LAST:
        # the words (Q6_K 52, Q3_K 27), then the 8 rows' fp16 d: row 5's d of the first tile's second block
        words = (block - 2) // 4
        assert np.array_equal(tile[8 * block + 32 * words + 2 * 5:][:2], raw[5, 2 * block - 2:2 * block])
    if weight_type in ("q5_0", "q5_1"):
        # bit 4 k + i of row r's fifth bits (Q5_0's qh at byte 2 of a block, Q5_1's at 4), for every block of the first
        # tile: as bit planes (Q5_1; Q5_0 where this CPU's best variant is not AVX-512's), bit k of byte 4 r + i at 16
        # (Q5_1: at 32, its word 1); as masks, bit 4 r + i of mask k at 16 + 4 k
        at, to = (2, 16) if weight_type == "q5_0" else (4, 32)
        qh = np.stack([raw[:8, b * block + at:b * block + at + 4].copy().view("<u4")[:, 0] for b in range(n_blocks)])
        fifth = np.stack([tile[b * 8 * block + to:b * 8 * block + to + 32] for b in range(n_blocks)])
        r, i, kk = np.meshgrid(np.arange(8), np.arange(4), np.arange(8), indexing="ij")
        want = (qh[:, r] >> (4 * kk + i)) & 1
        if weight_type == "q5_1" or cpu.dflash_cpu_q5_0_bit_planes():
            got = (fifth[:, 4 * r + i] >> kk) & 1
        else:
            got = (fifth.copy().view("<u4")[:, kk] >> (4 * r + i)) & 1
        assert np.array_equal(got, want)

    x = rng.standard_normal((max(BATCHES), k), dtype=np.float32)
    acts = _activations(native, cpu, weight_type, x)
    chosen, by_isa = kernels.isa, {}
    try:
        for isa, wide in kernels.variants(weight_type not in BLOCKS_OF_32):
            assert kernels.set_isa(isa)
            kernels.set_wide_k_tiles(wide)
            assert cpu.dflash_cpu_interleave_wanted(kind, n_rows)
            for n in BATCHES:
                for nth, claiming in ((1, False), (2, False), (2, True), (3, True)):
                    ours = _product(cpu.dflash_cpu_gemm_interleaved, weight_type, inter, acts, n_blocks, n, nth,
                                    claiming)
                    rows = _product(cpu.dflash_cpu_gemm, weight_type, raw, acts, n_blocks, n, nth, claiming)
                    assert not np.isnan(ours).any(), (isa, n, nth, claiming)          # every row computed
                    assert np.array_equal(ours.view(np.uint32), rows.view(np.uint32)), (isa, n, nth, claiming)
            by_isa[isa] = by_isa.get(isa, ours)
            assert np.array_equal(ours.view(np.uint32), by_isa[isa].view(np.uint32)), (isa, wide)
        # weights interleaved at load stay readable when the kernels are switched off afterwards
        best = kernels.runnable()[0]
        assert kernels.set_isa("none")
        off = _product(cpu.dflash_cpu_gemm_interleaved, weight_type, inter, acts, n_blocks, 5, 2)
        assert np.array_equal(off.view(np.uint32), by_isa[best][:5].view(np.uint32))
        assert not cpu.dflash_cpu_interleave_wanted(kind, n_rows)         # nothing is interleaved from now on
    finally:
        kernels.set_isa(chosen)
        kernels.set_wide_k_tiles(None)
    assert len(by_isa) == len(kernels.runnable()) - 1                     # every variant but "none" was checked
