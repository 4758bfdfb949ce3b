"""Synthetic DFlash2 (z-lab) and DSpark (DeepSeek DeepSpec) checkpoints: the published config names and
tensor layout, tiny dims, random weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from helpers.convert import random_drafter, state_numpy, write_zlab_folder, zlab_config
from dflash_gguf.drafter.config import DrafterConfig


def dflash2_tensors(config: DrafterConfig, *, kernel: int = 2, group: int = 16, rank: int = 8, seed: int = 0,
                    torch_model=None) -> dict[str, np.ndarray]:
    """DFlash v1 weights plus what z-lab's DFlash2DraftModel adds, in its names and torch shapes."""
    rng = np.random.default_rng(seed)
    H, V = config.hidden_size, config.vocab_size
    t = state_numpy(torch_model if torch_model is not None else random_drafter(config, seed))
    for i in range(config.n_layers):
        for side in ("attention_conv", "mlp_conv"):
            t[f"layers.{i}.{side}.base_kernel"] = (rng.standard_normal((2, kernel, H)) * 0.5).astype(np.float32)
            t[f"layers.{i}.{side}.kernel_projection.weight"] = (
                rng.standard_normal((2 * kernel * H // group, H)) / H ** 0.5).astype(np.float32)
    t["candidate_selector.predecessor_codebook"] = rng.standard_normal((V, rank)).astype(np.float32)
    t["candidate_selector.successor_codebook"] = rng.standard_normal((V, rank)).astype(np.float32)
    t["candidate_selector.hidden_projection.weight"] = (rng.standard_normal((rank, H)) / H ** 0.5).astype(np.float32)
    return t


def dspark_tensors(config: DrafterConfig, *, rank: int = 8, confidence: bool = True, seed: int = 0,
                   torch_model=None) -> dict[str, np.ndarray]:
    """DFlash v1 weights plus DeepSpec's Markov and confidence heads (and the copied target embedding/head)."""
    rng = np.random.default_rng(seed + 1)
    H, V = config.hidden_size, config.vocab_size
    t = state_numpy(torch_model if torch_model is not None else random_drafter(config, seed))
    t["markov_head.markov_w1.weight"] = rng.standard_normal((V, rank)).astype(np.float32)
    t["markov_head.markov_w2.weight"] = (rng.standard_normal((V, rank)) * 2 / rank ** 0.5).astype(np.float32)
    if confidence:
        t["confidence_head.proj.weight"] = (rng.standard_normal((1, H + rank)) / H ** 0.5).astype(np.float32)
        t["confidence_head.proj.bias"] = np.zeros(1, np.float32)
    t["embed_tokens.weight"] = rng.standard_normal((V, H)).astype(np.float32)
    t["lm_head.weight"] = rng.standard_normal((V, H)).astype(np.float32)
    return t


def write_dflash2_folder(folder: Path, config: DrafterConfig, tensors: dict, *, kernel: int = 2, group: int = 16,
                         rank: int = 8, top_k: int = 4, dflash_extra: dict | None = None) -> Path:
    """config.json as z-lab publishes a DFlash2 drafter (DFlash2DraftModel, settings in dflash_config);
    dflash_extra: more dflash_config keys (output_multiplier, final_logit_softcapping)."""
    write_zlab_folder(folder, config, tensors)
    cfg = zlab_config(config)
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["is_causal"] = False
    cfg["dflash_config"] |= {"conv_kernel_size": kernel, "conv_group_size": group, "selector_rank": rank,
                             "selector_top_k": top_k} | (dflash_extra or {})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_dspark_folder(folder: Path, config: DrafterConfig, tensors: dict, *, rank: int = 8,
                        confidence: bool = True, sample_from_anchor: bool | None = None) -> Path:
    """config.json as DeepSpec saves a Qwen3 DSpark drafter (Qwen3DSparkModel, top-level DSpark keys);
    sample_from_anchor: the key upstream's converter reads (absent: anchor-first, DeepSpec's layout)."""
    write_zlab_folder(folder, config, tensors)
    cfg = zlab_config(config)
    dflash = cfg.pop("dflash_config")
    cfg |= {"architectures": ["Qwen3DSparkModel"], "target_layer_ids": dflash["target_layer_ids"],
            "mask_token_id": dflash["mask_token_id"], "block_size": dflash["block_size"], "markov_rank": rank,
            "markov_head_type": "vanilla", "enable_confidence_head": confidence,
            "confidence_head_with_markov": True}
    if sample_from_anchor is not None:
        cfg["sample_from_anchor"] = sample_from_anchor
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


SHIPPED = Path(__file__).resolve().parents[2] / "dflash_gguf" / "assets" / "smollm2-135m-instruct.dflash-q8_0.gguf"


def shipped_family_drafter(member: str, target: Path, out: Path, *, outtype: str = "f32", seed: int = 0,
                           sample_from_anchor: bool = False, markov_scale: float = 0.3) -> Path:
    """The shipped SmolLM2 DFlash drafter grown into a DFlash2 or DSpark one that still accepts: DFlash2 with
    identity convolutions (base tap 0 = 1, projection 0) and a small random selector (top-k 16); DSpark with
    a small random Markov head and a confidence head. Full vocabulary (the target's head via ctx_other)."""
    from dflash_gguf.convert.flavours import detect_flavour, normalize_gguf
    from dflash_gguf.target_file import TargetFile
    from dflash_gguf.convert.writer import write_dflash_gguf
    tinfo = TargetFile.open(target)
    src = normalize_gguf(SHIPPED, detect_flavour(SHIPPED), tinfo)
    c, t = src.config, dict(src.tensors)
    c.vocab_size = tinfo.n_vocab
    H, V, rng = c.hidden_size, tinfo.n_vocab, np.random.default_rng(seed)
    if member == "DFlash2":
        c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k = 2, 16, 8, 16
        for i in range(c.n_layers):
            for side in ("attention_conv", "mlp_conv"):
                base = np.zeros((2, 2, H), np.float32)
                base[:, 0, :] = 1.0
                t[f"layers.{i}.{side}.base_kernel"] = base
                t[f"layers.{i}.{side}.kernel_projection.weight"] = np.zeros((2 * 2 * H // 16, H), np.float32)
        t["candidate_selector.predecessor_codebook"] = rng.standard_normal((V, 8)).astype(np.float32)
        t["candidate_selector.successor_codebook"] = rng.standard_normal((V, 8)).astype(np.float32)
        t["candidate_selector.hidden_projection.weight"] = (rng.standard_normal((8, H)) * 0.5 / H ** 0.5
                                                            ).astype(np.float32)
    else:
        c.markov_rank, c.confidence_head, c.sample_from_anchor = 8, True, sample_from_anchor
        t["markov_head.markov_w1.weight"] = rng.standard_normal((V, 8)).astype(np.float32)
        t["markov_head.markov_w2.weight"] = (rng.standard_normal((V, 8)) * markov_scale / 8 ** 0.5
                                             ).astype(np.float32)
        t["confidence_head.proj.weight"] = (rng.standard_normal((1, H + 8)) / H ** 0.5).astype(np.float32)
        t["confidence_head.proj.bias"] = np.zeros(1, np.float32)
    return write_dflash_gguf(t, c, target, out, outtype=outtype, force=True)


def markov_reference(path: Path):
    """chained(backbone [V] row, prev) -> [V]: a DSpark GGUF's Markov bias W2·W1[prev] added to the backbone's
    logits of one slot, over the draft vocabulary (-inf elsewhere) when the file has one. Weights read by
    gguf-py, float32 arithmetic as the engine's chain does it."""
    import gguf
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    def dense(name):
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(
            [int(d) for d in reversed(t.shape)])

    w1, w2 = dense("markov_w1.weight"), dense("markov_w2.weight")
    if "markov_w2.scale" in tensors:
        w2 = w2 * float(dense("markov_w2.scale").reshape(-1)[0])
    cols = np.asarray(tensors["d2t"].data, np.int64) if "d2t" in tensors else None

    def chained(base: np.ndarray, prev: int) -> np.ndarray:
        bias = w2 @ w1[prev]
        if cols is None:
            return base + bias
        row = np.full(base.shape, -np.inf, np.float32)
        row[cols] = base[cols] + bias
        return row
    return chained
