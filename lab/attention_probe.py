"""One ggml FLASH_ATTN_EXT on the CPU backend, driven from Python: for attention tests.

The op reads a K/V cache laid out as llama.cpp's (one row of all K/V heads per position, F16), a query of B rows
per head (F32) and an F16 mask of B rows, and goes through `ggml_graph_compute`, so the result comes from the
dispatch a model's decode uses (our kernel, patches/0012 and 0023; `use_ref=True`: ggml's stock kernel).
"""

from __future__ import annotations

import ctypes

import numpy as np

from dflash_gguf.native.lib import NativeLibrary
from lab.matmul_probe import GGML_TYPES, GRAPH_FUNCTIONS, GgmlProbe

_P, _S, _I64, _F = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_float

_BASE = {
    **GRAPH_FUNCTIONS,
    "ggml_new_tensor_3d": ([_P, ctypes.c_int, _I64, _I64, _I64], _P),
    "ggml_view_3d": ([_P, _P, _I64, _I64, _I64, _S, _S, _S], _P),
    "ggml_flash_attn_ext": ([_P, _P, _P, _P, _P, _F, _F, _F], _P),
}


class AttentionProbe(GgmlProbe):
    """Flash attention of `n_rows` query rows per head over a cache of `n_kv` positions.

    Shapes: head size `head_dim`, `n_head` query heads reading `n_head_kv` K/V heads (GQA). The cache and the
    mask are set by the caller; positions the mask hides (-inf) may hold anything.
    """

    def __init__(self, native: NativeLibrary, head_dim: int, n_head: int, n_head_kv: int, n_kv: int, n_rows: int):
        super().__init__(native, _BASE)
        self.shape = (head_dim, n_head, n_head_kv, n_kv, n_rows)
        cache = 2 * head_dim * n_head_kv * n_kv * 2
        mem = cache + 4 * head_dim * n_head * n_rows * 2 + 2 * n_kv * n_rows + (4 << 20)
        self._new_context(mem)
        f16, f32 = GGML_TYPES["f16"], GGML_TYPES["f32"]
        new3 = self.base.ggml_new_tensor_3d
        self.q = new3(self.ctx, f32, head_dim, n_rows, n_head)
        # llama.cpp's cache: [head_dim, n_head_kv, n_kv] seen as [head_dim, n_kv, n_head_kv], a position's row of all
        # heads apart by nb1
        self.k_cache = new3(self.ctx, f16, head_dim, n_head_kv, n_kv)
        self.v_cache = new3(self.ctx, f16, head_dim, n_head_kv, n_kv)
        row, head = 2 * head_dim * n_head_kv, 2 * head_dim
        k = self.base.ggml_view_3d(self.ctx, self.k_cache, head_dim, n_kv, n_head_kv, row, head, 0)
        v = self.base.ggml_view_3d(self.ctx, self.v_cache, head_dim, n_kv, n_head_kv, row, head, 0)
        self.mask = self.base.ggml_new_tensor_2d(self.ctx, f16, n_kv, n_rows)
        self.out = self.base.ggml_flash_attn_ext(self.ctx, self.q, k, v, self.mask, 1.0 / np.sqrt(head_dim), 0.0, 0.0)
        self.graph = self.base.ggml_new_graph(self.ctx)
        self.base.ggml_build_forward_expand(self.graph, self.out)

    def set_inputs(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray) -> None:
        """q [n_rows, n_head, head_dim], k and v [n_kv, n_head_kv, head_dim] (stored as F16), visible [n_rows, n_kv]
        bool (the mask: 0 where visible, -inf elsewhere)."""
        d, nh, nkv_h, n_kv, n = self.shape
        cache = (n_kv, nkv_h, d)
        if q.shape != (n, nh, d) or k.shape != cache or v.shape != cache or visible.shape != (n, n_kv):
            raise ValueError("q, k, v or visible has the wrong shape for this probe")
        self._write(self.q, np.ascontiguousarray(q.transpose(1, 0, 2), dtype=np.float32))   # [head, row, dim]
        self._write(self.k_cache, np.ascontiguousarray(k, dtype=np.float16))
        self._write(self.v_cache, np.ascontiguousarray(v, dtype=np.float16))
        self._write(self.mask, np.where(visible, 0.0, -np.inf).astype(np.float16))

    def compute(self, n_threads: int = 2, use_ref: bool = False) -> np.ndarray:
        """[n_rows, n_head, head_dim] float32: each row's attention output."""
        self._compute_graph(self.graph, n_threads, use_ref)
        d, nh, _, _, n = self.shape
        return self._read_f32(self.out, (n, nh, d))


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """float64 softmax attention of the same inputs (K and V rounded to F16 as the cache holds them)."""
    n, nh, d = q.shape
    group = nh // k.shape[1]
    kk = k.astype(np.float16).astype(np.float64)
    vv = v.astype(np.float16).astype(np.float64)
    out = np.zeros((n, nh, d))
    for h in range(nh):
        scores = q[:, h, :].astype(np.float64) @ kk[:, h // group, :].T / np.sqrt(d)   # [n, n_kv]
        scores = np.where(visible, scores, -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h, :] = (p / p.sum(axis=1, keepdims=True)) @ vv[:, h // group, :]
    return out
