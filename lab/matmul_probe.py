"""One ggml MUL_MAT on the CPU backend, driven from Python: for kernel tests and kernel timings.

It goes through `ggml_graph_compute`, so the result comes from the same dispatch (tinyBLAS, repack,
tiled, our ggml-kernels, vec_dot) that a model's decode uses. `use_ref=True` asks ggml for its stock
path (our kernels and the tiled K-quant path step aside; vec_dot / tinyBLAS stay).
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import numpy as np

from dflash_gguf.native.lib import NativeLibrary, bind, libname
from dflash_gguf.native.quantize import quantize_rows

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
              "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq2_xxs": 16, "iq2_xs": 17, "iq3_xxs": 18,
              "iq1_s": 19, "iq4_nl": 20, "iq3_s": 21, "iq2_s": 22, "iq4_xs": 23, "iq1_m": 29, "bf16": 30,
              "tq1_0": 34, "tq2_0": 35, "mxfp4": 39, "nvfp4": 40}

_P, _S, _I64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", _S), ("mem_buffer", _P), ("no_alloc", ctypes.c_bool)]


class _CPlan(ctypes.Structure):   # struct ggml_cplan (ggml-cpu.h)
    _fields_ = [("work_size", _S), ("work_data", _P), ("n_threads", ctypes.c_int), ("threadpool", _P),
                ("abort_callback", _P), ("abort_callback_data", _P), ("use_ref", ctypes.c_bool)]


# what every probe's graph takes from ggml-base (GgmlProbe); each probe adds its ops
GRAPH_FUNCTIONS = {
    "ggml_init": ([_InitParams], _P),
    "ggml_free": ([_P], None),
    "ggml_new_tensor_2d": ([_P, ctypes.c_int, _I64, _I64], _P),
    "ggml_new_graph": ([_P], _P),
    "ggml_build_forward_expand": ([_P, _P], None),
    "ggml_get_data": ([_P], _P),
}
_BASE = {
    **GRAPH_FUNCTIONS,
    "ggml_mul_mat": ([_P, _P, _P], _P),
    "ggml_nbytes": ([_P], _S),
    "ggml_row_size": ([ctypes.c_int, _I64], _S),
    "ggml_quantize_chunk": ([ctypes.c_int, _P, _P, _I64, _I64, _I64, _P], _S),
    "ggml_quantize_requires_imatrix": ([ctypes.c_int], ctypes.c_bool),
}
_CPU = {
    "ggml_cpu_init": ([], None),
    "ggml_graph_plan": ([_P, ctypes.c_int, _P], _CPlan),
    "ggml_graph_compute": ([_P, ctypes.POINTER(_CPlan)], ctypes.c_int),
}


class GgmlProbe:
    """ggml-base's functions (`self.base`: GRAPH_FUNCTIONS and the probe's own), ggml-cpu's (`self.cpu`) and one ggml
    context (`self.ctx`, made by `_new_context`, freed by `close`); computes its graphs, each plan and work buffer kept
    per (graph, threads, use_ref)."""

    ctx = None   # until _new_context: close() has nothing to free

    def __init__(self, native: NativeLibrary, base_functions: dict):
        self.base = bind(native.ggml_base, base_functions)
        self.cpu = bind(ctypes.CDLL(str(Path(native.lib_dir) / libname("ggml-cpu"))), _CPU)
        self.cpu.ggml_cpu_init()
        self._plans: dict[tuple[int, int, bool], tuple[_CPlan, np.ndarray]] = {}

    def _new_context(self, mem: int) -> None:
        self.ctx = self.base.ggml_init(_InitParams(mem, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate {mem} bytes")

    def _write(self, tensor: int, values: np.ndarray) -> None:
        """values (C-contiguous, the tensor's type and size) into the tensor's data"""
        ctypes.memmove(self.base.ggml_get_data(tensor), values.ctypes.data, values.nbytes)

    def _compute_graph(self, graph: int, n_threads: int, use_ref: bool) -> None:
        plans = self._plans
        key = (graph, n_threads, use_ref)
        if key not in plans:
            plan = self.cpu.ggml_graph_plan(graph, n_threads, None)
            work = np.empty(max(plan.work_size, 1), np.uint8)
            plan.work_data = work.ctypes.data
            plan.use_ref = use_ref
            plans[key] = (plan, work)
        plan, _ = plans[key]
        status = self.cpu.ggml_graph_compute(graph, ctypes.byref(plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {status}")

    def _read_f32(self, tensor: int, shape: tuple[int, ...]) -> np.ndarray:
        ptr = ctypes.cast(self.base.ggml_get_data(tensor), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=shape).copy()

    def close(self) -> None:
        if self.ctx:
            self.base.ggml_free(self.ctx)
            self.ctx = None

    def __del__(self):
        self.close()


class MatmulProbe(GgmlProbe):
    """Weight matrices of one type (`shapes`: [(n_rows, k)], one tensor each) times F32 activations.

    For every batch width n in `col_counts` there is one graph that multiplies every weight matrix by
    its own activations [n, k] (one activation tensor per distinct k). Many matrices make a timing
    stream its weights from memory the way a model's layers do; the graphs share the weights.
    """

    def __init__(self, native: NativeLibrary, weight_type: str, shapes: list[tuple[int, int]],
                 col_counts: list[int]):
        super().__init__(native, _BASE)
        self.type = GGML_TYPES[weight_type]
        self.shapes = list(shapes)
        ks = sorted({k for _, k in self.shapes})
        weight_bytes = sum(self.base.ggml_row_size(self.type, k) * r for r, k in self.shapes)
        act_bytes = sum(n * (sum(ks) + sum(r for r, _ in self.shapes)) * 4 for n in col_counts)
        n_tensors = len(self.shapes) * (1 + 2 * len(col_counts)) + len(ks) * len(col_counts)
        mem = weight_bytes + act_bytes + n_tensors * 512 + len(col_counts) * (1 << 20) + (1 << 20)
        self._new_context(mem)
        new = self.base.ggml_new_tensor_2d
        self.weights = [new(self.ctx, self.type, k, r) for r, k in self.shapes]
        self.x: dict[tuple[int, int], int] = {}
        self.outs: dict[tuple[int, int], int] = {}
        self.graphs: dict[int, int] = {}
        for n in col_counts:
            for k in ks:
                self.x[n, k] = new(self.ctx, GGML_TYPES["f32"], k, n)
            graph = self.base.ggml_new_graph(self.ctx)
            for i, (w, (_, k)) in enumerate(zip(self.weights, self.shapes)):
                self.outs[n, i] = self.base.ggml_mul_mat(self.ctx, w, self.x[n, k])
                self.base.ggml_build_forward_expand(graph, self.outs[n, i])
            self.graphs[n] = graph

    # data ------------------------------------------------------------------------------------
    def row_bytes(self, k: int) -> int:
        return self.base.ggml_row_size(self.type, k)

    def quantize(self, w: np.ndarray) -> np.ndarray:
        """ggml's own quantization of float32 [n_rows, k] to the weight type: uint8 [n_rows, row_bytes]."""
        return quantize_rows(self.type, w, self.base)

    def set_weights(self, i: int, raw: np.ndarray) -> None:
        """Raw rows of matrix i in ggml's layout, uint8 [n_rows, row_bytes]."""
        r, k = self.shapes[i]
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        if raw.shape != (r, self.row_bytes(k)):
            raise ValueError(f"weights {i} must be uint8 {(r, self.row_bytes(k))}, got {raw.shape}")
        self._write(self.weights[i], raw)

    def set_activations(self, x: np.ndarray) -> None:
        """float32 [n, k]: the activations of every matrix with that k in the graph of width n."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or tuple(x.shape) not in self.x:
            raise ValueError(f"activations must be float32 [n, k] with (n, k) in {sorted(self.x)}, got {x.shape}")
        self._write(self.x[x.shape], x)

    # compute ---------------------------------------------------------------------------------
    def compute(self, n: int, n_threads: int = 2, use_ref: bool = False) -> None:
        self._compute_graph(self.graphs[n], n_threads, use_ref)

    def result(self, n: int, i: int = 0) -> np.ndarray:
        """[n, n_rows] float32: row j = weights_i @ activations[j]."""
        return self._read_f32(self.outs[n, i], (n, self.shapes[i][0]))

    def time_compute(self, n: int, n_threads: int = 2, use_ref: bool = False, cpu_clock: bool = False) -> float:
        """Seconds of one compute of the graph of width n: wall clock, or with cpu_clock (one thread,
        which then runs in the calling thread) this thread's CPU time, blind to time spent descheduled."""
        clock = time.thread_time if cpu_clock else time.perf_counter
        if cpu_clock and n_threads != 1:
            raise ValueError("cpu_clock measures the calling thread: use n_threads=1")
        t0 = clock()
        self.compute(n, n_threads, use_ref)
        return clock() - t0
