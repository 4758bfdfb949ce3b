"""Drafter geometry and DFlash settings; the single source for the torch model, GGUF writer and readers."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from .. import gguf_family
from ..gguf_check import fit_problems
from ..target_file import TargetFile


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    target_layers: list[int]            # llama.cpp tap ids (= z-lab target_layer_ids + 1)
    block_size: int
    mask_token_id: int
    vocab_size: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    sliding_window: int | None = None
    layer_types: list[str] | None = None        # "full_attention" | "sliding_attention" per layer
    rope_scaling: dict | None = None            # HF style: {"rope_type": "yarn"|"linear", "factor": ..., ...}
    embedding_scale: float | None = None        # block embeddings × this (z-lab input_embedding_scale)
    logit_scale: float | None = None            # logits × this (z-lab output_multiplier)
    final_logit_softcapping: float | None = None
    hidden_act: str = "silu"                    # MLP gate activation: silu (SwiGLU) | gelu (GeGLU, tanh form)
    post_norms: bool = False                    # RMSNorm on the attention and MLP outputs (Gemma 2/3 layers)
    # z-lab is_causal: None (absent) = sliding layers causal inside the block, full-attention layers not;
    # False = every layer non-causal (DFlash2 ships so); True = every layer causal (llama.cpp cannot draft so)
    is_causal: bool | None = None
    # DFlash2 (z-lab): dynamic depthwise convolutions around attention/MLP + a top-K candidate selector
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    # DSpark (DeepSeek DeepSpec): a low-rank Markov head chained over the slots, optional confidence head
    markov_rank: int | None = None
    confidence_head: bool = False
    sample_from_anchor: bool | None = None      # True: row 0 (the anchor) predicts the first draft token
    extra: dict = field(default_factory=dict)   # anything else a source carried (kept for inspect)

    def __post_init__(self):
        if self.layer_types is not None and len(self.layer_types) != self.n_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.n_layers} layers")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.hidden_act not in ("silu", "gelu"):
            raise ValueError(f"hidden_act {self.hidden_act!r}: llama.cpp's dflash graph runs silu or gelu")
        if self.layer_types and "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")

    @property
    def member(self) -> gguf_family.Member:
        """Which member of the DFlash family: the one whose own setting is set (DFlash2 before DSpark)."""
        return next((m for m in gguf_family.MEMBERS if m.setting and getattr(self, m.setting)), gguf_family.DFLASH)

    @property
    def family(self) -> str:
        return self.member.name

    def member_settings(self) -> dict:
        """The settings only its family member has (gguf_family.Member.settings)."""
        return {k: getattr(self, k) for k in self.member.settings}

    @property
    def n_taps(self) -> int:
        return len(self.target_layers)

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "DrafterConfig":
        return cls(**json.loads(text))


def official_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default tap selection (HF layer indices; add 1 for llama.cpp tap ids).

    Python's round() is banker's rounding; the official code relies on it, so do we.
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def config_fit_problems(config: DrafterConfig, target: TargetFile) -> list[str]:
    """Every reason this drafter cannot run with this target (empty: it can)."""
    c = config
    problems = fit_problems(c.hidden_size, list(c.target_layers), c.mask_token_id, c.vocab_size,
                            target.n_embd, target.n_layer, target.n_vocab)
    if c.head_dim % 2:
        problems.append(f"head dim {c.head_dim} is odd (RoPE needs an even head dim)")
    if not (math.isfinite(c.rope_theta) and c.rope_theta > 1):
        problems.append(f"rope base {c.rope_theta} is not a usable RoPE base")
    if c.block_size < 2:
        problems.append(f"block size {c.block_size} leaves no slot to draft (needs >= 2)")
    if not c.target_layers:
        problems.append("no target layers")
    return problems + c.member.problems(c.hidden_size, c.member_settings())
