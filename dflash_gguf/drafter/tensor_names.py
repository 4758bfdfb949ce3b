"""Tensor-name tables: z-lab checkpoint names ↔ the upstream `dflash` GGUF names."""

from __future__ import annotations

import re

# global tensors: z-lab (HF) name → GGUF name
GLOBAL_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    # DFlash2 candidate selector (z-lab: the codebooks are parameters, no ".weight")
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
    # DSpark Markov and confidence heads (DeepSpec)
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
}

# per-layer tensors: z-lab suffix after "layers.N." → GGUF suffix after "blk.N."
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # sublayer output norms (Gemma-style targets' layers; not in z-lab checkpoints)
    "attn_post_norm.weight": "post_attention_norm.weight",
    "ffn_post_norm.weight": "post_ffw_norm.weight",
    # DFlash2 dynamic convolutions (the base kernels have no ".weight" upstream either)
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}

_HF_GLOBAL = {v: k for k, v in GLOBAL_NAMES.items()}
_HF_LAYER_SUFFIX = {v: k for k, v in LAYER_NAMES.items()}
_HF_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def gguf_tensor_name(hf_name: str) -> str:
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    m = _HF_LAYER.match(hf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"blk.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    raise KeyError(f"no GGUF name for drafter tensor {hf_name!r}")


def hf_tensor_name(gguf_name: str, global_aliases: dict[str, str] | None = None,
                   layer_aliases: dict[str, str] | None = None) -> str:
    """A GGUF tensor name (upstream, or another flavour's through its alias tables) → z-lab name.

    global_aliases: flavour name → upstream name; layer_aliases: flavour suffix after "blk.N." → upstream suffix.
    """
    name = (global_aliases or {}).get(gguf_name, gguf_name)
    if name in _HF_GLOBAL:
        return _HF_GLOBAL[name]
    m = _GGUF_LAYER.match(name)
    if m:
        suffix = (layer_aliases or {}).get(m.group(2), m.group(2))
        if suffix in _HF_LAYER_SUFFIX:
            return f"layers.{m.group(1)}.{_HF_LAYER_SUFFIX[suffix]}"
    raise KeyError(gguf_name)
