"""Does a drafter fit its target, and are its tensors what its configuration says? (no native library)"""

from __future__ import annotations

import math

import numpy as np

from ..drafter.config import DrafterConfig, config_fit_problems
from ..drafter.tensor_names import hf_tensor_name
from ..errors import UserError
from ..gguf_check import refuse_misfit
from ..target_file import TargetFile
from .normalized import same_model_name


class ConvertError(UserError):
    """The drafter cannot be converted as asked; the message says why and what to do."""


def check_config_fits(config: DrafterConfig, target: TargetFile, source: str) -> None:
    """Refuse to write a drafter whose configuration cannot run with this target (ConvertError)."""
    refuse_misfit(source, target.path, config_fit_problems(config, target), ConvertError)


def fit_warnings(config: DrafterConfig, target: TargetFile, trained_for: str | None = None,
                 num_target_layers: int | None = None) -> list[str]:
    """Signs the drafter was trained for another target although it fits this one's shapes."""
    warnings = []
    if trained_for and not any(same_model_name(trained_for, n) for n in (target.name, target.path.stem)):
        warnings.append(f"the drafter names '{trained_for}' as its target, this target is '{target.name}'")
    if num_target_layers and num_target_layers != target.n_layer:
        warnings.append(f"the drafter was built for a {num_target_layers}-layer target, this one has {target.n_layer}")
    if config.vocab_size and config.vocab_size != target.n_vocab:
        warnings.append(f"the drafter's vocabulary size {config.vocab_size} differs from the target's {target.n_vocab}")
    if target.rope_theta and not math.isclose(config.rope_theta, target.rope_theta, rel_tol=1e-6):
        warnings.append(f"the drafter's rope base {config.rope_theta:g} differs from the target's "
                        f"{target.rope_theta:g} (z-lab drafters copy the target's)")
    return warnings


def family_shapes(c: DrafterConfig, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """z-lab name → torch shape of every tensor the family member `c` adds to DFlash (gguf_family's tables)."""
    ne = c.member.shapes(c.hidden_size, c.n_layers, n_vocab, c.member_settings())
    return {hf_tensor_name(name): tuple(reversed(shape)) for name, shape in ne.items()}


def expected_shapes(c: DrafterConfig, n_vocab: int | None = None) -> dict[str, tuple[int, ...]]:
    """z-lab name → torch shape [out, in] for every tensor a drafter of this configuration has
    (n_vocab: the vocabulary the family's extra heads span; default the config's)."""
    qdim, kvdim, H, I = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    want = {"fc.weight": (H, c.n_taps * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(c.n_layers):
        p = f"layers.{i}."
        want |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                 p + "self_attn.q_proj.weight": (qdim, H), p + "self_attn.k_proj.weight": (kvdim, H),
                 p + "self_attn.v_proj.weight": (kvdim, H), p + "self_attn.o_proj.weight": (H, qdim),
                 p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,),
                 p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                 p + "mlp.down_proj.weight": (H, I)}
        if c.post_norms:
            want |= {p + "attn_post_norm.weight": (H,), p + "ffn_post_norm.weight": (H,)}
    return want | family_shapes(c, n_vocab or c.vocab_size)


def check_shapes(tensors: dict[str, np.ndarray], config: DrafterConfig, source: str,
                 n_vocab: int | None = None) -> None:
    want = expected_shapes(config, n_vocab)
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise ConvertError(f"{source}: missing tensors {missing[:6]}{' …' if len(missing) > 6 else ''}; "
                           "is this a complete DFlash drafter checkpoint?")
    unexpected = sorted(set(tensors) - set(want))
    if unexpected:
        raise ConvertError(f"{source}: tensors a {config.family} drafter does not have: {unexpected[:6]}"
                           f"{' …' if len(unexpected) > 6 else ''}; this drafter variant is not supported")
    wrong = [f"{n} {tuple(tensors[n].shape)} (expected {s})" for n, s in want.items() if tuple(tensors[n].shape) != s]
    if wrong:
        raise ConvertError(f"{source}: tensor shapes do not match its configuration (head dims, heads, layers or "
                           f"taps): {'; '.join(wrong[:4])}")
    bad = [n for n, t in tensors.items() if not np.isfinite(t).all()]
    if bad:
        raise ConvertError(f"{source}: tensors with NaN/inf values: {bad[:4]}; the checkpoint is damaged")
