"""Read a DFlash drafter from any checkpoint format into the normalised form (config + z-lab-named F32 tensors).

Formats: a z-lab style folder (config.json with dflash settings + model.safetensors, possibly
sharded), a Hugging Face repo id resolved through huggingface_hub (local cache first), or a
drafter GGUF of one of the flavours in `flavours.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..drafter.config import DrafterConfig, official_target_layer_ids
from ..errors import UserError
from ..gguf_family import DFLASH2, DSPARK, Member
from ..target_file import TargetFile
from .flavours import detect_flavour, normalize_gguf
from .hparams import rope_scaling_from_hf
from .normalized import DrafterSource, target_from_drafter_name
from .safetensors_io import read_safetensors_folder

# z-lab config features this converter cannot represent: (test on the config, what to say)
_REFUSED = (
    (lambda hf, d: d("markov_head_type", "vanilla") != "vanilla",
     "a DSpark drafter with a gated/rnn Markov head; only the vanilla (low-rank) head runs in llama.cpp"),
    (lambda hf, d: d("enable_confidence_head") and d("confidence_head_with_markov") is False,
     "a DSpark confidence head without the Markov input is not supported (llama.cpp reads [hidden; W1[prev]])"),
    (lambda hf, d: d("attention_value_scale") is not None or d("attention_scale") is not None,
     "attention (value) scales are not supported"),
    (lambda hf, d: hf.get("attention_bias"), "attention biases (attention_bias=true) are not supported"),
    (lambda hf, d: hf.get("hidden_act", "silu") != "silu", "only SwiGLU/silu drafters are supported"),
    (lambda hf, d: hf.get("rope_is_neox_style") is False, "interleaved (non-NeoX) RoPE is not supported"),
    (lambda hf, d: float((hf.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                                 hf.get("partial_rotary_factor", 1.0))) != 1.0,
     "partial rotary embeddings are not supported"),
)


def _is_member(hf: dict, member: Member) -> bool:
    """Is the config the family member's: its architecture names it, or it has the member's own setting?"""
    return member.name in str(hf.get("architectures")) or _cfg(hf, member.setting) is not None


def _cfg(hf: dict, key: str, default=None):
    """dflash_config first, then top level (the official lookup order)."""
    d = hf.get("dflash_config") or {}
    return d.get(key, hf.get(key, default))


def _sliding(hf: dict, n_layers: int) -> tuple[int | None, list[str] | None]:
    """(window, layer types) the official code uses: layer_types with sliding layers, or dflash_config.use_swa."""
    if _cfg(hf, "use_swa"):
        return int(_cfg(hf, "swa_window_size") or hf["sliding_window"]), ["sliding_attention"] * n_layers
    types = hf.get("layer_types") or []
    if "sliding_attention" in types and hf.get("sliding_window"):
        return int(hf["sliding_window"]), list(types)
    return None, None


def read_zlab_folder(folder: Path, target: TargetFile, block_size: int | None = None,
                     name: str | None = None) -> DrafterSource:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"{folder}: no config.json; a z-lab drafter folder has config.json + model.safetensors")
    try:
        hf = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_path}: invalid JSON ({e})") from e
    if "dflash_config" not in hf and "block_size" not in hf:
        raise UserError(f"{cfg_path}: no dflash_config / block_size: this is not a DFlash drafter config")
    for refused, why in _REFUSED:
        if refused(hf, lambda k, default=None: _cfg(hf, k, default)):
            raise UserError(f"{folder}: {why}")
    if (folder / "mask_embedding.pt").exists():
        raise UserError(f"{folder}: ships its own mask embedding (mask_embedding.pt), which needs the drafter to "
                        "carry a patched embedding table; convert it with llama.cpp's convert_hf_to_gguf.py")
    notes: list[str] = []
    try:
        config, n_target = _config_from_hf(hf, cfg_path, target, block_size, notes)
    except (KeyError, ValueError, TypeError) as e:
        raise UserError(f"{cfg_path}: incomplete or inconsistent drafter config ({type(e).__name__}: {e})") from e
    tensors = read_safetensors_folder(folder)
    extra = sorted(k for k in tensors if k.startswith(("embed_tokens", "lm_head")))
    for k in extra:
        tensors.pop(k)
    if extra:
        notes.append(f"dropped {extra}: the drafter borrows the target's embedding and head")
    _family_from_hf(hf, tensors, config, notes, cfg_path)
    label = name or folder.name
    return DrafterSource(config, tensors, f"z-lab folder {folder}", notes,
                         trained_for=target_from_drafter_name(label),
                         num_target_layers=n_target,
                         n_params=sum(t.size for t in tensors.values()))


def _config_from_hf(hf: dict, cfg_path: Path, target: TargetFile, block_size: int | None,
                    notes: list[str]) -> tuple[DrafterConfig, int | None]:
    """DrafterConfig (and the target depth it names) from a z-lab config.json; notes what it inferred."""
    n_layers = int(hf["num_hidden_layers"])
    n_target = hf.get("num_target_layers")
    ids = _cfg(hf, "target_layer_ids")
    if ids is None:
        n = int(n_target or target.n_layer)
        ids = official_target_layer_ids(n, n_layers)
        notes.append(f"target_layer_ids absent: computed with the official formula for {n} target layers: {ids}")
    mask = _cfg(hf, "mask_token_id")
    if mask is None:
        raise UserError(f"{cfg_path}: dflash_config.mask_token_id is missing; the drafter cannot mask its block")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    hidden, n_heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    window, layer_types = _sliding(hf, n_layers)
    causal = hf.get("is_causal", _cfg(hf, "causal"))
    if causal:
        notes.append("config asks for causal attention in every layer; llama.cpp drafts blocks non-causally")
    elif causal is not None and layer_types:
        notes.append("config says is_causal: false: its sliding layers see the whole block too")
    config = DrafterConfig(
        hidden_size=hidden, intermediate_size=int(hf["intermediate_size"]), n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
        head_dim=int(hf.get("head_dim") or hidden // n_heads), target_layers=[int(i) + 1 for i in ids],
        block_size=int(block_size or _cfg(hf, "block_size", 16)), mask_token_id=int(mask),
        vocab_size=int(hf.get("vocab_size") or 0), rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        sliding_window=window, layer_types=layer_types, rope_scaling=rope_scaling_from_hf(rope, str(cfg_path)),
        embedding_scale=_float_or_none(_cfg(hf, "input_embedding_scale")),
        logit_scale=_float_or_none(_cfg(hf, "output_multiplier")),
        final_logit_softcapping=_float_or_none(_cfg(hf, "final_logit_softcapping")) or None,
        is_causal=None if causal is None else bool(causal))
    return config, (int(n_target) if n_target else None)


def _family_from_hf(hf: dict, tensors: dict, config: DrafterConfig, notes: list[str], cfg_path: Path) -> None:
    """Fill the DFlash2 / DSpark settings of `config` from the config (or, where it is silent, the tensors)."""
    if _is_member(hf, DFLASH2):
        base = tensors.get("layers.0.attention_conv.base_kernel")
        book = tensors.get("candidate_selector.hidden_projection.weight")
        if base is None or book is None:
            raise UserError(f"{cfg_path}: a DFlash2 config, but model.safetensors has no attention_conv / "
                            "candidate_selector tensors; the checkpoint is incomplete")
        kernel = int(_cfg(hf, "conv_kernel_size") or base.shape[1])
        proj = tensors["layers.0.attention_conv.kernel_projection.weight"].shape[0]
        config.conv_kernel_size = kernel
        config.conv_group_size = int(_cfg(hf, "conv_group_size") or config.hidden_size * 2 * kernel // proj)
        config.selector_rank = int(_cfg(hf, "selector_rank") or book.shape[0])
        config.selector_top_k = int(_cfg(hf, "selector_top_k") or 16)
        notes.append(f"DFlash2: conv kernel {config.conv_kernel_size}, group {config.conv_group_size}, "
                     f"selector rank {config.selector_rank}, top-k {config.selector_top_k}")
    if _is_member(hf, DSPARK):
        w1 = tensors.get("markov_head.markov_w1.weight")
        if w1 is None:
            raise UserError(f"{cfg_path}: a DSpark config, but model.safetensors has no markov_head tensors; "
                            "the checkpoint is incomplete")
        config.markov_rank = int(w1.shape[1])
        config.confidence_head = "confidence_head.proj.weight" in tensors
        config.sample_from_anchor = bool(_cfg(hf, "sample_from_anchor", True))
        notes.append(f"DSpark: Markov rank {config.markov_rank}, confidence head "
                     f"{'yes' if config.confidence_head else 'no'}, "
                     f"{'anchor-first' if config.sample_from_anchor else 'bonus-anchor'} block")


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)


def resolve_source(src: str) -> Path:
    """A local path, or a Hugging Face repo id from the local cache (downloaded only when online)."""
    p = Path(src).expanduser()
    if p.exists():
        return p
    if src.count("/") == 1 and not src.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download  # noqa: PLC0415
        except ImportError:
            raise UserError(f"{src}: not a local path, and huggingface_hub is not installed") from None
        patterns = ["*.json", "*.safetensors"]
        try:
            return Path(snapshot_download(src, allow_patterns=patterns, local_files_only=True))
        except Exception:       # not cached: fall through to a download
            pass
        try:
            return Path(snapshot_download(src, allow_patterns=patterns))
        except Exception as e:
            raise UserError(f"{src}: not in the Hugging Face cache and could not be downloaded ({type(e).__name__}); "
                            "download it where the hub is reachable and pass the folder") from e
    raise UserError(f"{src}: no such file or folder")


def read_source(src: str, target: TargetFile, block_size: int | None = None) -> DrafterSource:
    path = resolve_source(src)
    if path.is_dir():
        name = src.split("/")[-1] if not Path(src).expanduser().exists() else path.name
        return read_zlab_folder(path, target, block_size, name=name)
    flavour = detect_flavour(path)
    source = normalize_gguf(path, flavour, target)
    if block_size:
        source.notes.append(f"block size {source.config.block_size} overridden to {block_size}")
        source.config.block_size = block_size
    return source
