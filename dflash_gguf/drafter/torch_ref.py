"""PyTorch reference of the DFlash drafter, written from the paper and spec (dflash-spec.md §1).

It is the training model and the parity reference for llama.cpp's `dflash` graph. Parameter names
are those of a z-lab checkpoint, so `state_dict()` round-trips with z-lab `model.safetensors`.

Shapes: B batch, S block rows, C context rows, H hidden, k taps, nh/nkv heads, hd head dim.
Context rows never enter the residual stream: they become K/V only (fc → hidden_norm → each
layer's k_proj/k_norm/RoPE and v_proj), placed before the block's own K/V ("KV injection").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import DrafterConfig
from .markov import ConfidenceHead, MarkovHead


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_frequencies(c: DrafterConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [hd/2] and the cos/sin magnitude for the config's RoPE (HF semantics).

    default: base^(-2i/hd); linear: divided by `factor`; yarn: per-dim blend of interpolated and
    extrapolated frequencies over the correction range, magnitude `attention_factor` (default
    0.1·ln(factor) + 1). llama.cpp's ggml_rope_ext computes the same (ggml_rope_yarn_corr_dims).
    """
    hd = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = c.rope_scaling or {}
    kind, factor = rs.get("rope_type", "default"), float(rs.get("factor", 1.0))
    if kind not in ("default", "linear", "yarn"):
        raise ValueError(f"rope scaling {kind!r} is not supported (default, linear, yarn)")
    if kind == "linear":
        return (inv / factor).float(), 1.0
    if kind == "default":
        return inv.float(), 1.0
    n_orig = float(rs["original_max_position_embeddings"])

    def corr_dim(n_rot: float) -> float:
        return hd * math.log(n_orig / (n_rot * 2 * math.pi)) / (2 * math.log(c.rope_theta))

    low = max(math.floor(corr_dim(float(rs.get("beta_fast", 32.0)))), 0)
    high = min(math.ceil(corr_dim(float(rs.get("beta_slow", 1.0)))), hd - 1)
    ramp = ((torch.arange(hd // 2, dtype=torch.float64) - low) / max(0.001, high - low)).clamp(0, 1)
    extrapolate = 1 - ramp                                              # 1: keep the original frequency
    inv = inv / factor * (1 - extrapolate) + inv * extrapolate
    mscale = rs.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return inv.float(), float(mscale)


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, mscale: float = 1.0) -> torch.Tensor:
    """NeoX-style rotary embedding over the full head dim. x: [B, T, h, hd], pos: [B, T], inv_freq: [hd/2]."""
    hd = x.shape[-1]
    ang = pos.to(torch.float32)[..., None] * inv_freq.to(x.device)                                  # [B, T, hd/2]
    cos, sin = ang.cos()[:, :, None, :] * mscale, ang.sin()[:, :, None, :] * mscale
    x1, x2 = x[..., : hd // 2].float(), x[..., hd // 2:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)
        # a plain attribute, not a buffer: stays float32 when the module is cast to bf16, and out of state_dict
        self.inv_freq, self.mscale = rope_frequencies(c)

    def forward(self, x: torch.Tensor, g: torch.Tensor, block_pos: torch.Tensor, ctx_pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        c, (B, S, _), C = self.c, x.shape, g.shape[1]
        f, m = self.inv_freq, self.mscale
        q = rope(self.q_norm(self.q_proj(x).view(B, S, c.n_heads, c.head_dim)), block_pos, f, m)
        k_ctx = rope(self.k_norm(self.k_proj(g).view(B, C, c.n_kv_heads, c.head_dim)), ctx_pos, f, m)
        k_blk = rope(self.k_norm(self.k_proj(x).view(B, S, c.n_kv_heads, c.head_dim)), block_pos, f, m)
        v_ctx = self.v_proj(g).view(B, C, c.n_kv_heads, c.head_dim)
        v_blk = self.v_proj(x).view(B, S, c.n_kv_heads, c.head_dim)
        k = torch.cat([k_ctx, k_blk], dim=1).transpose(1, 2)              # [B, nkv, C+S, hd]
        v = torch.cat([v_ctx, v_blk], dim=1).transpose(1, 2)
        q = q.transpose(1, 2)                                              # [B, nh, S, hd]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True,
                                             scale=c.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, c.n_heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        # ggml_gelu is the tanh form (llama.cpp LLM_FFN_GELU, as Gemma's gelu_pytorch_tanh)
        self.act = F.silu if c.hidden_act == "silu" else lambda t: F.gelu(t, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.mlp = MLP(c)
        # Gemma 2/3 layers normalise each sublayer's output too (llama.cpp attn_post_norm / ffn_post_norm)
        self.attn_post_norm = RMSNorm(c.hidden_size, c.rms_eps) if c.post_norms else nn.Identity()
        self.ffn_post_norm = RMSNorm(c.hidden_size, c.rms_eps) if c.post_norms else nn.Identity()

    def forward(self, x, g, block_pos, ctx_pos, mask):
        x = x + self.attn_post_norm(self.self_attn(self.input_layernorm(x), g, block_pos, ctx_pos, mask))
        return x + self.ffn_post_norm(self.mlp(self.post_attention_layernorm(x)))


class DFlashDrafter(nn.Module):
    layer_class = DecoderLayer          # DFlash2 (tests/helpers/torch_ref_family.py) wraps its sublayers

    def __init__(self, config: DrafterConfig, markov_columns: int | None = None):
        """markov_columns: with `config.markov_rank`, a DSpark Markov head (markov.py) over this many logit
        columns (the draft vocabulary's size, or the whole vocabulary); None: the DFlash backbone alone."""
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(c.n_taps * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.layers = nn.ModuleList(self.layer_class(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.markov_head = MarkovHead(c.vocab_size, c.markov_rank, markov_columns) \
            if c.markov_rank and markov_columns else None
        self.confidence_head = None
        if c.confidence_head and self.markov_head is not None:
            with torch.random.fork_rng(devices=[]):      # the backbone's initialisation stays what it was without
                self.confidence_head = ConfidenceHead(c.hidden_size, c.markov_rank)
        # Official semantics (z-lab dflash): sliding layers are causal inside the block unless the config says
        # is_causal: false (DFlash2 does; then every layer sees the whole block), as our patched llama.cpp runs
        # them (patches/0005). Stock llama.cpp 0c1e57098 always runs them non-causally (later block positions
        # visible); set False to reproduce that (tests/test_drafter_parity.py).
        self.sliding_causal = c.is_causal is not False

    def forward(self, block_emb: torch.Tensor, ctx_feats: torch.Tensor, block_pos: torch.Tensor,
                ctx_pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """block_emb [B,S,H] (target embeddings of the block tokens), ctx_feats [B,C,k*H] (tapped target
        features), positions [B,S]/[B,C]; mask [B,S,C+S] bool (True = may attend) or None for inference
        semantics. Returns the final-normed hidden states [B,S,H]."""
        g = self.hidden_norm(self.fc(ctx_feats))
        x = block_emb * self.config.embedding_scale if self.config.embedding_scale else block_emb
        for i, layer in enumerate(self.layers):
            m = mask if mask is not None else self.inference_mask(block_pos, ctx_pos, self.config.is_sliding(i))
            x = layer(x, g, block_pos, ctx_pos, m)
        return self.norm(x)

    def inference_mask(self, block_pos: torch.Tensor, ctx_pos: torch.Tensor, sliding: bool = False) -> torch.Tensor:
        """All context visible and the block bidirectional; sliding layers: causal in the block and
        windowed (query_pos - key_pos < window) over everything."""
        keys = torch.cat([ctx_pos, block_pos], dim=1)                      # [B, C+S]
        dist = block_pos[:, :, None] - keys[:, None, :]                    # [B, S, C+S]
        if not sliding:
            return torch.ones_like(dist, dtype=torch.bool)
        window = dist < (self.config.sliding_window or 1 << 30)
        return window & (dist >= 0) if self.sliding_causal else window

    def logits(self, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """hidden [B,S,H] @ lm_head [V,H]^T → [B,S,V], then the optional logit scale and tanh softcap
        (they never change the argmax; they matter for sampling)."""
        out = hidden @ lm_head.t()
        c = self.config
        if c.logit_scale:
            out = out * c.logit_scale
        if c.final_logit_softcapping:
            out = torch.tanh(out / c.final_logit_softcapping) * c.final_logit_softcapping
        return out
