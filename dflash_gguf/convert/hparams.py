"""Optional drafter hyper-parameters ↔ GGUF keys: RoPE scaling, sliding window, embedding/logit scales.

One place that knows how an HF `rope_scaling` dict, a `DrafterConfig` and the GGUF keys llama.cpp
reads (src/llama-model.cpp, src/models/dflash.cpp) correspond, used by the writer and every reader.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..drafter.config import DrafterConfig
from ..errors import UserError
from ..gguf_family import MEMBERS

ROPE_SCALING_TYPES = ("linear", "yarn")
# DrafterConfig field → GGUF key suffix after "{arch}."; all read by llama.cpp's dflash loader
SCALAR_KEYS = {
    "embedding_scale": "embedding_scale",
    "logit_scale": "logit_scale",
    "final_logit_softcapping": "final_logit_softcapping",
}
# the family members' own keys: DrafterConfig field = GGUF key suffix, uint32 or bool (gguf_family.Member.keys)
FAMILY_KEYS = {k: kind for m in MEMBERS for k, kind in m.keys.items()}
HIDDEN_ACT = "hidden_activation"               # silu (absent) | gelu: llama.cpp's dflash loader reads both
# z-lab is_causal (bool, absent = None): llama.cpp reads it into hparams.causal_attn; with it false, patches/0005
# leaves the sliding layers non-causal too
CAUSAL = "attention.causal"
# HF yarn field → GGUF key suffix
YARN_KEYS = {
    "original_max_position_embeddings": "rope.scaling.original_context_length",
    "beta_fast": "rope.scaling.yarn_beta_fast",
    "beta_slow": "rope.scaling.yarn_beta_slow",
}


def _yarn_default_mscale(factor: float) -> float:
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def rope_scaling_from_hf(rope: dict, where: str) -> dict | None:
    """HF `rope_scaling` / `rope_parameters` → the normalised dict DrafterConfig keeps (None: plain RoPE)."""
    kind = rope.get("rope_type") or rope.get("type")
    if kind in (None, "default"):
        return None
    if kind not in ROPE_SCALING_TYPES:
        raise UserError(f"{where}: rope scaling '{kind}' is not supported (only linear and yarn); "
                        "convert this drafter with llama.cpp's convert_hf_to_gguf.py --target-model-dir")
    if "factor" not in rope:
        raise UserError(f"{where}: rope scaling '{kind}' without a factor")
    out: dict[str, Any] = {"rope_type": kind, "factor": float(rope["factor"])}
    if kind == "yarn":
        if rope.get("mscale") or rope.get("mscale_all_dim"):
            raise UserError(f"{where}: YaRN with mscale/mscale_all_dim (DeepSeek style) is not supported")
        if rope.get("original_max_position_embeddings") is None:
            raise UserError(f"{where}: YaRN rope scaling needs original_max_position_embeddings")
        out["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
        for key in ("beta_fast", "beta_slow"):
            if rope.get(key) is not None:
                out[key] = float(rope[key])
        factor = rope.get("attention_factor", rope.get("attn_factor"))
        if factor is not None:
            out["attention_factor"] = float(factor)
    return out


def write_hparams(w, arch: str, c: DrafterConfig) -> None:
    """Optional keys of `c` into a GGUFWriter."""
    rs = c.rope_scaling
    if rs:
        w.add_string(f"{arch}.rope.scaling.type", rs["rope_type"])
        w.add_float32(f"{arch}.rope.scaling.factor", rs["factor"])
        for field, suffix in YARN_KEYS.items():
            if field in rs:
                value = rs[field]
                (w.add_uint32 if isinstance(value, int) else w.add_float32)(f"{arch}.{suffix}", value)
        if "attention_factor" in rs:
            # llama.cpp recomputes the YaRN magnitude as 0.1·ln(factor)+1 and ignores yarn_attn_factor;
            # rope.scaling.attn_factor multiplies that, so an explicit HF attention_factor is its ratio to it
            w.add_float32(f"{arch}.rope.scaling.attn_factor", rs["attention_factor"] / _yarn_default_mscale(rs["factor"]))
    if c.is_causal is not None:
        w.add_bool(f"{arch}.{CAUSAL}", bool(c.is_causal))
    if c.sliding_window and c.layer_types:
        w.add_uint32(f"{arch}.attention.sliding_window", c.sliding_window)
        w.add_array(f"{arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in c.layer_types])
    for field, suffix in SCALAR_KEYS.items():
        value = getattr(c, field)
        if value is not None:
            w.add_float32(f"{arch}.{suffix}", float(value))
    for key, kind in FAMILY_KEYS.items():
        value = getattr(c, key)
        if value is not None:
            (w.add_bool if kind is bool else w.add_uint32)(f"{arch}.{key}", kind(value))
    if c.hidden_act != "silu":
        w.add_string(f"{arch}.{HIDDEN_ACT}", c.hidden_act)


def read_hparams(get: Callable[[str], Any], n_layers: int, head_dim: int, where: str) -> tuple[dict, list[str]]:
    """DrafterConfig keyword arguments for the optional keys of a drafter GGUF (`get(suffix)` reads
    "{arch}.{suffix}" or returns None), plus notes on what was interpreted."""
    notes: list[str] = []
    for suffix in ("attention.scale", "attention.value_scale"):
        if get(suffix) is not None:
            raise UserError(f"{where}: {suffix} is set; drafters with attention scales are not supported")
    kwargs: dict[str, Any] = {field: (float(get(suffix)) if get(suffix) is not None else None)
                              for field, suffix in SCALAR_KEYS.items()}
    for key, kind in FAMILY_KEYS.items():
        value = get(key)
        if value is not None:
            kwargs[key] = str(value).lower() == "true" if kind is bool else int(value)
    act = get(HIDDEN_ACT)
    if act is not None:
        if str(act) not in ("silu", "gelu", "gelu_pytorch_tanh"):
            raise UserError(f"{where}: hidden activation '{act}' is not supported (silu or gelu)")
        kwargs["hidden_act"] = "silu" if str(act) == "silu" else "gelu"
    causal = get(CAUSAL)
    if causal is not None:
        kwargs["is_causal"] = str(causal).lower() == "true"
    n_rot = get("rope.dimension_count")
    if n_rot is not None and int(n_rot) != head_dim:
        raise UserError(f"{where}: partial rotary embedding (rope.dimension_count {n_rot} < head dim {head_dim}) "
                        "is not supported")
    sections = get("rope.dimension_sections")
    if sections is not None:
        if any(int(s) for s in list(sections)[1:]):
            raise UserError(f"{where}: multi-section M-RoPE {list(sections)} is not supported for drafters")
        notes.append("dropped degenerate M-RoPE sections: with one section it is NeoX RoPE over the position")
    kind = get("rope.scaling.type")
    if kind not in (None, "none"):
        rope: dict[str, Any] = {"rope_type": kind, "factor": get("rope.scaling.factor")}
        for field, suffix in YARN_KEYS.items():
            if get(suffix) is not None:
                rope[field] = get(suffix)
        if get("rope.scaling.yarn_log_multiplier"):
            raise UserError(f"{where}: YaRN with a log multiplier (DeepSeek style) is not supported")
        scaled = rope_scaling_from_hf({k: v for k, v in rope.items() if v is not None}, where)
        if scaled and kind == "yarn":
            attn = get("rope.scaling.attn_factor")
            if attn is not None:
                scaled["attention_factor"] = float(attn) * _yarn_default_mscale(scaled["factor"])
            elif get("rope.scaling.yarn_attn_factor") is not None:
                scaled["attention_factor"] = float(get("rope.scaling.yarn_attn_factor"))
                notes.append("yarn_attn_factor kept as the HF attention_factor (llama.cpp itself ignores that key)")
        kwargs["rope_scaling"] = scaled
    window = get("attention.sliding_window")
    pattern = get("attention.sliding_window_pattern")
    if window and pattern is not None:
        if isinstance(pattern, (int, float)):       # a period: every n-th layer full (llama_hparams::set_swa_pattern)
            n = int(pattern)
            pattern = [n == 0 or i % n < n - 1 for i in range(n_layers)]
        kwargs["sliding_window"] = int(window)
        kwargs["layer_types"] = ["sliding_attention" if p else "full_attention" for p in list(pattern)[:n_layers]]
    elif window:
        notes.append(f"sliding_window {window} without a per-layer pattern: every layer is full attention "
                     "(as the runtimes that wrote this file treat it)")
    return kwargs, notes
