"""The frozen pieces of the target a drafter trains against: token embedding and LM head (dequantized),
and optionally its last layers as the drafter's starting point."""

from __future__ import annotations

import numpy as np

from ..drafter.tensor_names import LAYER_NAMES
from ..target_file import TargetFile


def _tensor(target: TargetFile, name: str) -> np.ndarray | None:
    import gguf  # noqa: PLC0415
    t = target.tensors.get(name)
    if t is None:
        return None
    arr = gguf.quants.dequantize(t.data, t.tensor_type)
    return np.asarray(arr, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])


def embedding_and_head(target: TargetFile) -> tuple[np.ndarray, np.ndarray]:
    """[V, H] token embedding and [V, H] LM head (the embedding itself for tied models)."""
    embed = _tensor(target, "token_embd.weight")
    head = _tensor(target, "output.weight")
    return embed, embed if head is None else head


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def layer_init(target: TargetFile, first_layer: int, n_layers: int) -> dict[str, np.ndarray]:
    """z-lab-named tensors for draft layers 0..n_layers-1 copied from target layers first_layer.. ."""
    from .arch_traits import traits  # noqa: PLC0415
    t = target
    arch = traits(t.arch, t.n_embd)
    out = {}
    for i in range(n_layers):
        src = min(first_layer + i, t.n_layer - 1)
        found = {gguf_suffix: _tensor(t, f"blk.{src}.{gguf_suffix}") for gguf_suffix in LAYER_NAMES.values()}
        found |= _split_fused(t, src, arch)
        for hf_suffix, gguf_suffix in LAYER_NAMES.items():
            arr = found.get(gguf_suffix)
            if arr is None:
                continue
            if arch.permuted_qk and gguf_suffix in ("attn_q.weight", "attn_k.weight"):
                arr = _unpermute(arr, t.n_head if gguf_suffix == "attn_q.weight" else t.n_head_kv)
            out[f"layers.{i}.{hf_suffix}"] = arr
    norm = _tensor(t, "output_norm.weight")
    if norm is not None:
        out["norm.weight"] = norm
    return out


def _split_fused(t: TargetFile, layer: int, arch) -> dict[str, np.ndarray]:
    """q/k/v and gate/up of targets that store them fused (phi3), under the unfused GGUF names."""
    out = {}
    qkv = _tensor(t, f"blk.{layer}.attn_qkv.weight") if arch.fused_qkv else None
    if qkv is not None:
        q, kv = t.n_head * t.head_dim, t.n_head_kv * t.head_dim
        out |= {"attn_q.weight": qkv[:q], "attn_k.weight": qkv[q:q + kv], "attn_v.weight": qkv[q + kv:q + 2 * kv]}
    up = _tensor(t, f"blk.{layer}.ffn_up.weight") if arch.fused_gate_up else None
    if up is not None and up.shape[0] == 2 * t.n_ff:
        out |= {"ffn_gate.weight": up[:t.n_ff], "ffn_up.weight": up[t.n_ff:]}
    return out
