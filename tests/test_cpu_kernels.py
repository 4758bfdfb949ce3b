"""Our CPU kernels (ggml-kernels/cpu, wired in by patches/0003) against references, through ggml itself.

Every product runs as a ggml MUL_MAT in `ggml_graph_compute`, i.e. through the dispatch a model's decode uses.
Random Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS,
IQ2_S, IQ1_S, IQ1_M, F16, BF16 and F32 weights (quantized by ggml; the IQ2 and IQ1 types with a flat importance matrix) times random activations of B = 1..16 columns and one wide batch, for shapes whose rows
are not a multiple of the tiles and K from 32 to 1536, on every instruction-set variant this CPU runs (an AVX-512 machine
runs the AVX2 variant too):
- against float64 products of the dequantized weights: normalized MSE within test-backend-ops' 5e-4
  (what remains is the 8-bit rounding of the activations, ~3e-5);
- against ggml's stock path (`use_ref`: vec_dot / tinyBLAS): the same integer arithmetic for the
  quantized types (only the float summation order differs, ~1e-13); F16 / BF16 activations rounded to F16 /
  BF16 by ggml, not by us (~1e-7 / ~1e-6); a wrong row, column or block would not be that close;
- batch invariance, bit for bit: column j of a B-column product equals the product of that column
  alone, for every B; and every variant gives the same bits (integer sums are exact, the float steps
  are the same __m256 operations on both), the bits recorded on an AVX-512 machine included, so an AVX2-only
  machine checks its variant against the other one too (fails when a variant's float steps change).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from dflash_gguf.native.lib import libname
from lab.matmul_probe import MatmulProbe

BATCHES = list(range(1, 17)) + [40]     # 40: wider than one pass on AVX2 and on AVX-512
NMSE_VS_F32 = 5e-4                      # test-backend-ops' MUL_MAT tolerance
QUANTIZED = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs",
             "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"]
TYPES = QUANTIZED + ["f16", "bf16", "f32"]
NMSE_VS_STOCK = {t: 1e-9 for t in QUANTIZED} | {"f16": 1e-5, "bf16": 1e-4, "f32": 1e-9}
# the AVX-512 variant may step their tiles in pairs
K_TILED = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s",
           "iq1_m"}
# weights per block (32 for the rest)
BLOCK = {t: 256 for t in K_TILED} | {"f16": 1, "bf16": 1, "f32": 1}
# (n_rows, k, threads): rows not a multiple of the 8-row tiles, one and several blocks per row
# (40, 256, 1): one thread's chunk of whole tiles, so the AVX-512 variant steps K-quant tiles in pairs (two threads
# claim chunks of one tile each in these small products)
SHAPES = [(100, 576, 2), (37, 1536, 2), (13, 32, 1), (576, 576, 1), (11, 44, 2), (21, 512, 2), (9, 256, 1),
          (40, 256, 1)]
CASES = [(t, *shape) for t in TYPES for shape in SHAPES if shape[1] % BLOCK.get(t, 32) == 0]


# The bits every variant must produce, recorded on an AVX-512 machine (tests/data/cpu_kernel_bits.json): an
# AVX2-only machine cannot run the AVX-512 variant, so without them its cross-variant check would compare AVX2
# with itself. Record anew after a deliberate change of a kernel's float steps:
#   DFLASH_RECORD_KERNEL_BITS=1 .venv/bin/python -m pytest tests/test_cpu_kernels.py -k references
RECORDED_BITS = Path(__file__).parent / "data" / "cpu_kernel_bits.json"


def _digest(out: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(out, dtype=np.float32).view(np.uint32).tobytes()).hexdigest()[:16]


def _check_recorded_bits(case: str, by_isa: dict[str, dict[int, np.ndarray]]) -> None:
    digests = {isa: {str(n): _digest(out) for n, out in ours.items()} for isa, ours in by_isa.items()}
    if os.environ.get("DFLASH_RECORD_KERNEL_BITS"):
        assert "avx512" in digests, "record the bits on an AVX-512 machine (it runs both variants)"
        recorded = json.loads(RECORDED_BITS.read_text()) if RECORDED_BITS.exists() else {}
        recorded[case] = digests["avx512"]
        RECORDED_BITS.parent.mkdir(exist_ok=True)
        RECORDED_BITS.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(RECORDED_BITS.read_text()).get(case)
    assert recorded is not None, f"{case}: no recorded bits in {RECORDED_BITS.name} (see RECORDED_BITS)"
    for isa, d in digests.items():
        assert d == recorded, f"{case}: the {isa} variant's bits differ from those recorded on AVX-512"


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    return float(((out - ref) ** 2).sum() / (ref ** 2).sum())


def _weights(probe: MatmulProbe, weight_type: str, n_rows: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(raw rows in ggml's layout, quantized by ggml; dequantized float64 [n_rows, k])"""
    w = rng.standard_normal((n_rows, k), dtype=np.float32)
    w[:, : k // 2] += 0.5                           # blocks with a clearly non-zero min (Q4_1)
    if weight_type == "f32":
        return w.view(np.uint8).reshape(n_rows, -1), w.astype(np.float64)
    if weight_type == "f16":
        h = w.astype(np.float16)
        return h.view(np.uint8).reshape(n_rows, -1), h.astype(np.float64)
    raw = probe.quantize(w)
    return raw, quants.dequantize(raw, GGMLQuantizationType[weight_type.upper()]).astype(np.float64)


def test_the_best_runnable_variant_is_chosen(kernels):
    assert kernels.batch_invariant
    runnable = kernels.runnable()
    assert kernels.batch_invariant                                # trying "none" did not leave it switched off
    assert "avx2" in runnable and "none" in runnable, runnable   # CI machines are x86 with AVX2
    requested = os.environ.get("DFLASH_CPU_ISA", "")
    assert kernels.isa == (requested if requested in runnable else runnable[0])   # what was asked for, or the best
    # the AVX-VNNI variant runs exactly where the kernel reports the feature (Linux names it avx_vnni)
    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert ("avxvnni" in runnable) == ("avx_vnni" in flags), runnable
    assert not kernels.set_isa("sse9")


def _cpu_family_and_flags() -> tuple[str, str, set[str]]:
    info = Path("/proc/cpuinfo").read_text()
    fields = {k.strip(): v for k, v in (line.split(":", 1) for line in info.split("\n\n")[0].splitlines() if ":" in line)}
    return fields.get("vendor_id", "").strip(), fields.get("cpu family", "").strip(), set(fields.get("flags", "").split())


def test_the_512_bit_rate_probe_tells_split_cores_from_full_rate_ones(kernels):
    """The K-quants step two tiles at a time from 4 columns only where 512-bit dot steps run at full rate; on a core
    that splits them it costs a verify of 4-12 rows 1.1-1.4x (Zen 4, docs/cpu-kernels.md). The probe read every
    AVX-512 core as full rate while its eight chains started equal (the compiler kept one)."""
    vendor, family, flags = _cpu_family_and_flags()
    if "avx512_vnni" not in flags:
        pytest.skip("no AVX-512 VNNI: the probe is not run")
    answers = set()
    for _ in range(3):
        kernels.set_wide_k_tiles(None)                   # decided afresh
        answers.add(kernels.wide_k_tiles)
    kernels.set_wide_k_tiles(None)
    assert len(answers) == 1, "the probe changes its mind between calls"
    if vendor == "AuthenticAMD" and family == "25":      # Zen 4: 512-bit steps in two halves
        assert answers == {False}


@pytest.mark.parametrize("weight_type,n_rows,k,n_threads", CASES)
def test_matmul_matches_references_and_is_batch_invariant(native, kernels, weight_type, n_rows, k, n_threads):
    chosen = kernels.isa
    rng = np.random.default_rng(n_rows * 7919 + k)
    probe = MatmulProbe(native, weight_type, [(n_rows, k)], BATCHES)
    raw, w_deq = _weights(probe, weight_type, n_rows, k, rng)
    probe.set_weights(0, raw)
    x = {n: rng.standard_normal((n, k), dtype=np.float32) for n in BATCHES}
    by_isa = {}
    for isa, wide in kernels.variants(weight_type in K_TILED):
        assert kernels.set_isa(isa)
        kernels.set_wide_k_tiles(wide)
        label = isa + ("-wide-k-tiles" if wide else "")
        ours = {}
        for n in BATCHES:
            probe.set_activations(x[n])
            probe.compute(n, n_threads)
            ours[n] = probe.result(n)                   # [n, n_rows]
            probe.compute(n, n_threads, use_ref=True)
            stock = probe.result(n)
            ref = x[n].astype(np.float64) @ w_deq.T
            assert np.isfinite(ours[n]).all()
            assert nmse(ours[n], ref) <= NMSE_VS_F32, f"{label} B={n}: far from the float reference"
            assert nmse(ours[n], stock) <= NMSE_VS_STOCK[weight_type], f"{label} B={n}: far from ggml's stock path"
        for n in BATCHES[1:]:                           # each column alone, through the B = 1 graph
            for j in range(n):
                probe.set_activations(x[n][j:j + 1])
                probe.compute(1, n_threads)
                alone = probe.result(1)[0]
                assert np.array_equal(ours[n][j].view(np.uint32), alone.view(np.uint32)), \
                    f"{label} {weight_type}: column {j} of B={n} differs from the same column alone"
        by_isa[label] = ours
    kernels.set_isa(chosen)
    kernels.set_wide_k_tiles(None)
    first = next(iter(by_isa.values()))
    for isa, ours in by_isa.items():
        for n in BATCHES:
            assert np.array_equal(ours[n].view(np.uint32), first[n].view(np.uint32)), f"{isa} differs, B={n}"
    _check_recorded_bits(f"{weight_type}-{n_rows}-{k}", by_isa)
    probe.close()


@pytest.mark.parametrize("weight_type", TYPES)
def test_isa_none_is_ggmls_own_path(native, kernels, weight_type):
    """With our kernels switched off the dispatch steps aside completely: bit-identical to use_ref."""
    rng = np.random.default_rng(5)
    k = max(64, BLOCK.get(weight_type, 32))
    probe = MatmulProbe(native, weight_type, [(40, k)], [1, 5])
    raw, _ = _weights(probe, weight_type, 40, k, rng)
    probe.set_weights(0, raw)
    chosen = kernels.isa
    assert kernels.set_isa("none")
    assert not kernels.batch_invariant
    try:
        for n in (1, 5):
            probe.set_activations(rng.standard_normal((n, k), dtype=np.float32))
            probe.compute(n, 2)
            ours = probe.result(n)
            probe.compute(n, 2, use_ref=True)
            assert np.array_equal(ours, probe.result(n))
    finally:
        kernels.set_isa(chosen)
    probe.close()


# Types our kernels do not cover (the ternary and FP4 formats): ggml's own vec_dot paths, kept width-independent by
# patches/0010 (no tinyBLAS, no tiled K-quant matmul, repacked weights through the one-column gemv)
UNCOVERED = ["tq1_0", "tq2_0", "mxfp4", "nvfp4"]


@pytest.mark.parametrize("weight_type", UNCOVERED)
def test_types_our_kernels_do_not_cover_stay_batch_invariant(native, kernels, weight_type):
    """Column j of a B-column product equals that column alone, for every B, and the products match float64. Until
    2026-12-06 the IQ1 types were here, and with ggml's own paths (isa none) their products differed from 8 columns
    (its tiled K-quant matmul); these four take vec_dot at every width there too (measured, isa none, this shape),
    so what this guards is that the dispatch keeps them on it."""
    from gguf import GGMLQuantizationType
    assert kernels.batch_invariant
    n_rows, k = 40, 512
    rng = np.random.default_rng(11)
    w = rng.standard_normal((n_rows, k), dtype=np.float32)
    x = rng.standard_normal((max(BATCHES), k), dtype=np.float32)
    probe = MatmulProbe(native, weight_type, [(n_rows, k)], BATCHES)
    raw = probe.quantize(w)
    probe.set_weights(0, raw)
    w_deq = quants.dequantize(raw, GGMLQuantizationType[weight_type.upper()]).astype(np.float64)
    alone = []
    for j in range(len(x)):
        probe.set_activations(x[j:j + 1])
        probe.compute(1, 2)
        alone.append(probe.result(1)[0].copy())
    for n in BATCHES[1:]:
        probe.set_activations(x[:n])
        probe.compute(n, 2)
        out = probe.result(n)
        assert nmse(out, x[:n].astype(np.float64) @ w_deq.T) <= NMSE_VS_F32
        for j in range(n):
            assert np.array_equal(out[j].view(np.uint32), alone[j].view(np.uint32)), \
                f"{weight_type}: column {j} of {n} differs from that column alone"
    probe.close()


Q8_K_BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])   # ggml's block_q8_K


def _q8_k_inputs(rng) -> np.ndarray:
    """Blocks of 256 activations, ordinary and awkward: wide and tiny ranges, exact rounding ties, the largest
    magnitude twice with opposite signs, all zeros, denormals, NaN and infinities."""
    blocks = [rng.standard_normal(256) * s for s in (1.0, 1e-3, 300.0, 1e-30)]
    ties = rng.integers(-126, 127, 256) + 0.5                      # iscale = 1: every value a tie
    ties[7] = -127.0
    blocks.append(ties)
    both_signs = rng.standard_normal(256)
    both_signs[[3, 200]] = [5.0, -5.0]                             # the first of the two sets max's sign
    blocks.append(both_signs)
    blocks.append(np.zeros(256))
    blocks.append(np.full(256, 1e-41))                             # denormal floats
    for special in (np.nan, np.inf, -np.inf):
        b = rng.standard_normal(256)
        b[[0, 100]] = special
        blocks.append(b)
    return np.concatenate(blocks).astype(np.float32)


def test_k_quant_activations_are_ggmls_bytes_in_vector_steps(native, kernels):
    """The K-quants' activations, quantized by our vector steps (patches/0013), are byte for byte what ggml's
    scalar quantize_row_q8_K_ref writes, on every variant this CPU runs and for awkward input too (a changed
    rounding, tie rule or choice of the largest magnitude fails here)."""
    cpu = ctypes.CDLL(str(Path(native.lib_dir) / libname("ggml-cpu")))
    base = ctypes.CDLL(str(Path(native.lib_dir) / libname("ggml-base")))
    ours, ref = cpu.dflash_cpu_quantize_row_q8_K, base.quantize_row_q8_K_ref
    ours.argtypes = ref.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    ours.restype, ref.restype = ctypes.c_bool, None
    x = _q8_k_inputs(np.random.default_rng(13))
    n_blocks = len(x) // 256
    expected = np.zeros(n_blocks, Q8_K_BLOCK)
    with np.errstate(all="ignore"):
        ref(x.ctypes.data, expected.ctypes.data, len(x))
    chosen = kernels.isa
    try:
        for isa in [i for i in kernels.runnable() if i != "none"]:
            assert kernels.set_isa(isa)
            got = np.zeros(n_blocks, Q8_K_BLOCK)
            assert ours(x.ctypes.data, got.ctypes.data, len(x))
            for b in range(n_blocks):
                assert got[b].tobytes() == expected[b].tobytes(), f"{isa}: block {b} differs from ggml's"
        assert kernels.set_isa("none")
        assert not ours(x.ctypes.data, np.zeros(n_blocks, Q8_K_BLOCK).ctypes.data, len(x))   # ggml's own, then
    finally:
        kernels.set_isa(chosen)
