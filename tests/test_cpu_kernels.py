"""Our CPU kernels (ggml-kernels/cpu, wired in by patches/0003) against references, through ggml itself.

Every product runs as a ggml MUL_MAT in `ggml_graph_compute`, i.e. through the dispatch a model's
decode uses. Random Q4_1 and Q8_0 weights (quantized by gguf-py) times random activations of
B = 1..16 columns and one wide batch, for shapes whose rows are not a multiple of the 8-row tile and
K = 32, 576, 1536:
- against float64 products of the dequantized weights: normalized MSE within test-backend-ops' 5e-4
  (what remains is the 8-bit rounding of the activations, ~3e-5);
- against ggml's stock path (`use_ref`: vec_dot / tinyBLAS), which does the same integer arithmetic:
  only the float summation order differs, so the two agree to ~1e-13; a wrong row, column or block
  would not;
- the dispatch: where our rule (dflash_cpu_gemm_wanted) declines a batch width, the result is
  bit-identical to the stock path; where it takes it, it is not (other summation order).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from dflash_gguf.native.lib import _libname, load
from dflash_gguf.native.matmul_probe import MatmulProbe

BATCHES = list(range(1, 17)) + [40]     # 40: wider than one pass on AVX2 and on AVX-512
NMSE_VS_F32 = 5e-4                      # test-backend-ops' MUL_MAT tolerance
NMSE_VS_STOCK = 1e-9


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    return float(((out - ref) ** 2).sum() / (ref ** 2).sum())


@pytest.fixture(scope="module")
def native():
    return load()


GGML_TYPE = {"q4_1": 3, "q8_0": 8}
GGUF_TYPE = {"q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}


@pytest.fixture(scope="module")
def wanted(native):
    """dflash_cpu_gemm_wanted(type, n_cols) of this build; always False for a build without our kernels."""
    cpu = ctypes.CDLL(str(Path(native.lib_dir) / _libname("ggml-cpu")))
    fn = getattr(cpu, "dflash_cpu_gemm_wanted", None)
    if fn is None:
        return lambda weight_type, n: False
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int64], ctypes.c_bool
    return lambda weight_type, n: bool(fn(GGML_TYPE[weight_type], n))


@pytest.mark.parametrize("weight_type", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n_rows,k,n_threads", [(100, 576, 2), (37, 1536, 2), (13, 32, 1), (576, 576, 1)])
def test_matmul_matches_references(native, wanted, weight_type, n_rows, k, n_threads):
    rng = np.random.default_rng(n_rows * 7919 + k)
    w = rng.standard_normal((n_rows, k), dtype=np.float32)
    w[:, : k // 2] += 0.5                           # blocks with a clearly non-zero min (Q4_1)
    raw = quants.quantize(w, GGUF_TYPE[weight_type])
    w_deq = quants.dequantize(raw, GGUF_TYPE[weight_type]).astype(np.float64)   # [n_rows, k]

    probe = MatmulProbe(native, weight_type, [(n_rows, k)], BATCHES)
    probe.set_weights(0, raw)
    taken_and_differs = []
    for n in BATCHES:
        x = rng.standard_normal((n, k), dtype=np.float32)
        probe.set_activations(x)
        probe.compute(n, n_threads)
        ours = probe.result(n)                      # [n, n_rows]
        probe.compute(n, n_threads, use_ref=True)
        stock = probe.result(n)
        ref = x.astype(np.float64) @ w_deq.T
        assert np.isfinite(ours).all()
        assert nmse(ours, ref) <= NMSE_VS_F32, f"B={n}: far from the float reference"
        assert nmse(ours, stock) <= NMSE_VS_STOCK, f"B={n}: differs from ggml's stock path beyond rounding"
        if wanted(weight_type, n):
            taken_and_differs.append(not np.array_equal(ours, stock))
        else:
            assert np.array_equal(ours, stock), f"B={n}: declined by the rule, yet not ggml's own result"
    if taken_and_differs:
        # our kernels sum in another order than ggml, so bit-identical results mean they never ran
        assert any(taken_and_differs), f"{weight_type} products never went through ggml-kernels/cpu"
    probe.close()
