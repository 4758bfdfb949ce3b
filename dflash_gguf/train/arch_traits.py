"""What a trained drafter borrows from its target's architecture, so that training computes what llama.cpp's
`dflash` graph will (src/models/dflash.cpp: the target's token_embd × `embedding_scale`, layers with
`hidden_activation` silu|gelu and optional post norms, RMSNorm x·w, the target's `output` head).

- Gemma (1, 2, 3): llama.cpp's gemma graphs scale the token embeddings by √H, gate the MLP with GELU (tanh
  form), and Gemma 2/3 normalise each sublayer's output. Their GGUFs store RMSNorm weights with HF's (1 + w)
  already added by llama.cpp's converter, so the drafter's plain x·w is Gemma's norm.
- Gemma 2's final logit soft-capping is not applied: the dflash graph leaves it to the sampler and our engine
  reads raw draft logits; a monotone cap changes no argmax, and the drafter learns its own scale.
- llama/mistral-style GGUFs store q/k permuted for llama.cpp's NORM RoPE; the drafter (NeoX RoPE) unpermutes them
  when it starts from the target's layers. phi3 stores q/k/v and gate/up fused; they are split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ArchTraits:
    embedding_scale: float | None = None      # × this on the block's token embeddings
    hidden_act: str = "silu"
    post_norms: bool = False
    permuted_qk: bool = False                 # q/k rows permuted for NORM RoPE in the GGUF
    fused_qkv: bool = False                   # attn_qkv.weight = [q; k; v]
    fused_gate_up: bool = False               # ffn_up.weight = [gate; up]


_PERMUTED = {"llama", "mistral", "mistral3", "granite"}


def traits(arch: str, n_embd: int) -> ArchTraits:
    if arch in ("gemma", "gemma2", "gemma3"):
        return ArchTraits(embedding_scale=math.sqrt(n_embd), hidden_act="gelu", post_norms=arch != "gemma")
    if arch == "phi3":
        return ArchTraits(fused_qkv=True, fused_gate_up=True)
    return ArchTraits(permuted_qk=arch in _PERMUTED)
