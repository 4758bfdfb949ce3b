"""The frozen pieces of the target a drafter trains against: token embedding and LM head (dequantized),
and optionally its last layers as the drafter's starting point."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..convert.names import LAYER_NAMES



def _reader(path: Path):
    from ..convert.target_info import read_gguf  # noqa: PLC0415
    return read_gguf(path, "target GGUF")


def _tensor(reader, name: str) -> np.ndarray | None:
    import gguf  # noqa: PLC0415
    for t in reader.tensors:
        if t.name == name:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
            return np.asarray(arr, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
    return None


def embedding_and_head(target: Path) -> tuple[np.ndarray, np.ndarray]:
    """[V, H] token embedding and [V, H] LM head (the embedding itself for tied models)."""
    r = _reader(target)
    embed = _tensor(r, "token_embd.weight")
    head = _tensor(r, "output.weight")
    return embed, embed if head is None else head


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def layer_init(target: Path, first_layer: int, n_layers: int) -> dict[str, np.ndarray]:
    """z-lab-named tensors for draft layers 0..n_layers-1 copied from target layers first_layer.. ."""
    from ..convert.target_info import read_target  # noqa: PLC0415
    from .target_arch import traits  # noqa: PLC0415
    r, t = _reader(target), read_target(target)
    n_head, n_head_kv, n_layer = t.n_head, t.n_head_kv, t.n_layer
    arch = traits(t.arch, t.n_embd)
    out = {}
    for i in range(n_layers):
        src = min(first_layer + i, n_layer - 1)
        found = {gguf_suffix: _tensor(r, f"blk.{src}.{gguf_suffix}") for gguf_suffix in LAYER_NAMES.values()}
        found |= _split_fused(r, src, arch, t)
        for hf_suffix, gguf_suffix in LAYER_NAMES.items():
            arr = found.get(gguf_suffix)
            if arr is None:
                continue
            if arch.permuted_qk and gguf_suffix in ("attn_q.weight", "attn_k.weight"):
                arr = _unpermute(arr, n_head if gguf_suffix == "attn_q.weight" else n_head_kv)
            out[f"layers.{i}.{hf_suffix}"] = arr
    norm = _tensor(r, "output_norm.weight")
    if norm is not None:
        out["norm.weight"] = norm
    return out



def _split_fused(r, layer: int, arch, t) -> dict[str, np.ndarray]:
    """q/k/v and gate/up of targets that store them fused (phi3), under the unfused GGUF names."""
    out = {}
    qkv = _tensor(r, f"blk.{layer}.attn_qkv.weight") if arch.fused_qkv else None
    if qkv is not None:
        q, kv = t.n_head * t.head_dim, t.n_head_kv * t.head_dim
        out |= {"attn_q.weight": qkv[:q], "attn_k.weight": qkv[q:q + kv], "attn_v.weight": qkv[q + kv:q + 2 * kv]}
    up = _tensor(r, f"blk.{layer}.ffn_up.weight") if arch.fused_gate_up else None
    if up is not None and up.shape[0] == 2 * t.n_ff:
        out |= {"ffn_gate.weight": up[:t.n_ff], "ffn_up.weight": up[t.n_ff:]}
    return out
