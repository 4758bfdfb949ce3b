"""Random drafters (torch reference) and their files in every source format, for convert tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash_gguf.convert.writer import finish
from dflash_gguf.drafter.config import DrafterConfig


def random_drafter(config: DrafterConfig, seed: int = 0):
    import torch

    from dflash_gguf.drafter.torch_ref import DFlashDrafter
    torch.manual_seed(seed)
    m = DFlashDrafter(config)
    with torch.no_grad():
        for _, p in m.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if p.ndim == 1 else torch.randn_like(p) / p.shape[1] ** 0.5)
    return m


def state_numpy(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def zlab_config(config: DrafterConfig, *, with_ids: bool = True, n_target_layers: int | None = None) -> dict:
    """config.json as z-lab publishes it (HF layer ids in dflash_config)."""
    dflash = {"mask_token_id": config.mask_token_id, "block_size": config.block_size}
    if with_ids:
        dflash["target_layer_ids"] = [t - 1 for t in config.target_layers]
    cfg = {"architectures": ["DFlashDraftModel"], "hidden_size": config.hidden_size,
           "intermediate_size": config.intermediate_size, "num_hidden_layers": config.n_layers,
           "num_attention_heads": config.n_heads, "num_key_value_heads": config.n_kv_heads, "head_dim": config.head_dim,
           "rms_norm_eps": config.rms_eps, "rope_theta": config.rope_theta, "vocab_size": config.vocab_size,
           "num_target_layers": n_target_layers, "dflash_config": dflash, "hidden_act": "silu"}
    if config.rope_scaling:
        cfg["rope_scaling"] = dict(config.rope_scaling)
    if config.layer_types:
        cfg["layer_types"], cfg["sliding_window"] = config.layer_types, config.sliding_window
    return cfg


def write_zlab_folder(folder: Path, config: DrafterConfig, tensors: dict[str, np.ndarray], *, with_ids: bool = True,
                      n_target_layers: int | None = None, bf16: bool = True, shards: int = 1) -> Path:
    """config.json + model.safetensors (bf16, like z-lab), or `shards` files with an index."""
    import torch
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(zlab_config(config, with_ids=with_ids,
                                                               n_target_layers=n_target_layers)))
    dtype = torch.bfloat16 if bf16 else torch.float32
    names = sorted(tensors)
    if shards == 1:
        save_file({k: torch.tensor(tensors[k]).to(dtype).contiguous() for k in names}, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for s in range(shards):
        part = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        chunk = names[s::shards]
        save_file({k: torch.tensor(tensors[k]).to(dtype).contiguous() for k in chunk}, str(folder / part))
        weight_map |= {k: part for k in chunk}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def write_flavoured_gguf(upstream: Path, out: Path, flavour, *, with_ids: bool = True,
                         embed_borrowed: bool = False, extra_keys: dict | None = None) -> Path:
    """Rewrite an upstream dflash GGUF in another flavour's schema (arch, keys, tensor names, id convention)."""
    import gguf
    r = gguf.GGUFReader(str(upstream))
    w = gguf.GGUFWriter(str(out), flavour.arch)
    taps = [int(x) for x in r.fields["dflash.target_layers"].contents()]
    ids = [t - 1 for t in taps] if flavour.ids_are_hf else taps
    inverse_global = {v: k for k, v in flavour.global_aliases.items()}
    inverse_layer = {v: k for k, v in flavour.layer_aliases.items()}
    for key, f in r.fields.items():
        if key.startswith(("GGUF.", "dflash_gguf.")) or key == "general.architecture":
            continue
        if key in ("dflash.target_layers", "dflash.block_size", "tokenizer.ggml.mask_token_id"):
            continue
        new_key = flavour.arch + key[len("dflash"):] if key.startswith("dflash.") else key
        w.add_key_value(new_key, f.contents(), f.types[0], sub_type=f.types[1] if len(f.types) > 1 else None)
    if with_ids:
        w.add_array(flavour.target_layer_keys[0], ids)
    w.add_uint32(flavour.block_size_keys[0], int(r.fields["dflash.block_size"].contents()))
    w.add_uint32(flavour.mask_keys[0], int(r.fields["tokenizer.ggml.mask_token_id"].contents()))
    if flavour.marker:
        w.add_uint32(flavour.marker, 0)
    for key, value in (extra_keys or {}).items():
        w.add_uint32(key, value)
    n_embd = int(r.fields["dflash.embedding_length"].contents())
    for t in r.tensors:
        name = inverse_global.get(t.name, t.name)
        parts = name.split(".", 2)
        if parts[0] == "blk" and parts[2] in inverse_layer:
            name = f"blk.{parts[1]}.{inverse_layer[parts[2]]}"
        w.add_tensor(name, np.array(t.data), raw_dtype=t.tensor_type)
    if embed_borrowed:
        n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
        for name in ("token_embd.weight", "output.weight"):
            w.add_tensor(name, np.ones((n_vocab, n_embd), dtype=np.float32))
    finish(w)
    return out

