"""Drafter GGUF flavours found in the wild, one table row each, normalised to the upstream schema.

Every name a flavour spells differently from upstream `dflash` lives in its row: the architecture
string, where the target layer ids are and whether they are raw HF ids (upstream stores id + 1),
block size / mask token keys, and tensor-name aliases. Read from the writers' own sources:
upstream llama.cpp (src/models/dflash.cpp, conversion/qwen.py), buun-llama-cpp / beellama.cpp /
ik_llama.cpp (LLM_ARCH_DFLASH_DRAFT: "%s.dflash.*" keys, dflash_fc / dflash_hidden_norm /
blk.N.post_attention_norm), Lucebox (server/scripts/convert_dflash_to_gguf.py: dflash.fc.weight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..drafter.config import DrafterConfig, official_target_layer_ids
from ..errors import UserError
from ..gguf_family import MEMBERS
from ..gguf_reader import open_gguf
from ..target_file import TargetFile
from ..drafter.draft_vocab import DraftVocab, check_d2t, rows_over_vocab
from .hparams import read_hparams
from ..drafter.tensor_names import hf_tensor_name
from .normalized import DrafterSource, target_from_drafter_name


@dataclass(frozen=True)
class Flavour:
    name: str
    arch: str                                   # general.architecture; geometry keys are "{arch}.*"
    written_by: str
    target_layer_keys: tuple[str, ...]
    ids_are_hf: bool                            # raw HF layer ids: add 1 for llama.cpp tap ids
    block_size_keys: tuple[str, ...]
    mask_keys: tuple[str, ...]
    marker: str | None = None                   # a key only this flavour writes (tells same-arch rows apart)
    global_aliases: dict = field(default_factory=dict)   # flavour tensor name → upstream name
    layer_aliases: dict = field(default_factory=dict)    # flavour suffix after "blk.N." → upstream suffix


_LUCEBOX_TENSORS = {"dflash.fc.weight": "fc.weight", "dflash.hidden_norm.weight": "enc.output_norm.weight"}

FLAVOURS = (
    Flavour("upstream-raw-ids", "dflash", "an early upstream converter (dflash-spec.md §5.1)",
            ("dflash.target_layers",), True, ("dflash.block_size",), ("tokenizer.ggml.mask_token_id",),
            marker="dflash.target_hidden_size"),
    Flavour("upstream", "dflash", "llama.cpp convert_hf_to_gguf.py, dflash-gguf",
            ("dflash.target_layers",), False, ("dflash.block_size",), ("tokenizer.ggml.mask_token_id",)),
    Flavour("dflash-draft", "dflash-draft", "buun-llama-cpp, beellama.cpp, ik_llama.cpp",
            ("dflash-draft.dflash.target_layer_ids",), True, ("dflash-draft.dflash.block_size",),
            ("dflash-draft.dflash.mask_token_id", "tokenizer.ggml.mask_token_id"),
            global_aliases={"dflash_fc.weight": "fc.weight", "dflash_hidden_norm.weight": "enc.output_norm.weight"},
            layer_aliases={"post_attention_norm.weight": "ffn_norm.weight"}),
    Flavour("qwen35-dflash-draft", "qwen35-dflash-draft", "Lucebox",
            ("qwen35-dflash-draft.dflash.target_layer_ids",), True, ("qwen35-dflash-draft.dflash.block_size",),
            ("qwen35-dflash-draft.dflash.mask_token_id", "tokenizer.ggml.mask_token_id"),
            global_aliases=_LUCEBOX_TENSORS),
    Flavour("gemma4-dflash-draft", "gemma4-dflash-draft", "Lucebox",
            ("gemma4-dflash-draft.dflash.target_layer_ids",), True, ("gemma4-dflash-draft.dflash.block_size",),
            ("gemma4-dflash-draft.dflash.mask_token_id", "tokenizer.ggml.mask_token_id"),
            global_aliases=_LUCEBOX_TENSORS),
    Flavour("dspark", "dspark", "early DSpark converters (before upstream moved DSpark to arch dflash)",
            ("dspark.target_layers",), False, ("dspark.block_size",),
            ("tokenizer.ggml.mask_token_id", "dspark.mask_token_id")),
)

# drafters of other designs that share an architecture string: (metadata key or tensor name, what it is)
UNSUPPORTED = (
    ("dflash.hyper_connection.count", "a DeepSeek-V4 DSpark drafter (hyper-connection MoE stages)"),
    ("d2t", "a reduced-vocabulary drafter with its own LM head (d2t mapping)"),
    ("dflash-draft.dflash.laguna", "a Laguna DFlash drafter (per-tap norms, gated attention)"),
)
_BORROWED = ("token_embd.weight", "output.weight", "output_extra.weight")


def detect_flavour(path: Path) -> Flavour:
    r = open_gguf(path)
    f = r.fields.get("general.architecture")
    arch = f.contents() if f is not None else None
    tensor_names = {t.name for t in r.tensors}
    for marker, what in UNSUPPORTED:
        if marker == "d2t" and arch == "dflash":     # upstream's own schema: a reduced vocabulary it loads
            continue
        if marker in r.fields or marker in tensor_names:
            raise UserError(f"{path}: {what}; only DFlash, DFlash2 and DSpark drafters (fc + hidden_norm + "
                            "dense layers) are supported")
    for flavour in FLAVOURS:
        if flavour.arch == arch and (flavour.marker is None or flavour.marker in r.fields):
            return flavour
    known = ", ".join(sorted({fl.arch for fl in FLAVOURS}))
    raise UserError(f"{path}: architecture '{arch}' is not a DFlash drafter ({known}); "
                    "if it is the target model, pass it with --target instead")


def _first(r, keys: tuple[str, ...]):
    for key in keys:
        f = r.fields.get(key)
        if f is not None:
            return f.contents()
    return None


def _required(r, keys: tuple[str, ...], what: str, path: Path):
    value = _first(r, keys)
    if value is None:
        raise UserError(f"{path}: no {what} in the metadata (looked for {', '.join(keys)}); "
                        "the file is incomplete — convert the drafter from its original checkpoint")
    return value


def normalize_gguf(path: Path, flavour: Flavour, target: TargetFile | None,
                   load_tensors: bool = True) -> DrafterSource:
    """A flavoured drafter GGUF as a DrafterSource (z-lab-named float32 tensors; none when not
    `load_tensors`). Without a target, missing target layer ids stay empty and vocab_size 0."""
    import gguf  # noqa: PLC0415
    r = open_gguf(path)

    def get(suffix, default=None):
        f = r.fields.get(f"{flavour.arch}.{suffix}")
        return f.contents() if f is not None else default

    notes = [f"flavour: {flavour.name} (written by {flavour.written_by})"]
    n_layers, n_embd, n_head = int(get("block_count")), int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", n_embd // n_head))
    ids = _first(r, flavour.target_layer_keys)
    if ids is None and target is None:
        taps = []
        notes.append("no target layer ids in the file: convert computes them for the target (official formula)")
    elif ids is None:
        ids = official_target_layer_ids(target.n_layer, n_layers)
        taps = [i + 1 for i in ids]
        notes.append(f"no target layer ids in the file: computed with the official formula for the target's "
                     f"{target.n_layer} layers: HF ids {ids} → tap ids {taps}")
    else:
        ids = [int(i) for i in ids]
        taps = [i + 1 for i in ids] if flavour.ids_are_hf else ids
        if flavour.ids_are_hf:
            notes.append(f"target layer ids {ids} are HF ids: stored as tap ids {taps}")
    tensors: dict[str, np.ndarray] = {}
    n_params, seen = 0, {}
    from tqdm import tqdm  # noqa: PLC0415  (a gguf dependency)
    big = load_tensors and sum(int(t.n_elements) for t in r.tensors) > 50_000_000
    by_name = {t.name: t for t in r.tensors}
    draft_vocab = _draft_vocab(by_name, target, path) if "d2t" in by_name and load_tensors else None
    for t in tqdm(r.tensors, desc=f"reading {path.name}", unit="tensor", disable=not big):
        if t.name == "d2t" or (t.name == "output.weight" and "d2t" in by_name) or t.name == "markov_w2.scale":
            continue
        if t.name in _BORROWED:
            notes.append(f"dropped {t.name}: the drafter borrows the target's")
            continue
        try:
            name = hf_tensor_name(t.name, flavour.global_aliases, flavour.layer_aliases)
        except KeyError:
            raise UserError(f"{path}: unknown tensor '{t.name}' for flavour {flavour.name}; "
                            "this drafter variant is not supported") from None
        if name in seen:
            raise UserError(f"{path}: tensors '{seen[name]}' and '{t.name}' both read as '{name}' in flavour "
                            f"{flavour.name}; this drafter variant is not supported")
        seen[name] = t.name
        n_params += int(t.n_elements)
        if not load_tensors:
            continue
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[name] = np.asarray(arr, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
    if "markov_w2.scale" in by_name and load_tensors:     # a per-tensor scale: fold it into W2
        scale = float(np.asarray(by_name["markov_w2.scale"].data, dtype=np.float32).reshape(-1)[0])
        tensors["markov_head.markov_w2.weight"] *= scale
        notes.append(f"markov_w2.scale {scale:g} folded into markov_w2")
    if "d2t" in by_name and "markov_w2.weight" in by_name and load_tensors:
        # W2 has a row per d2t entry; our tensor dicts hold it over the whole vocabulary (W1's rows), zero elsewhere
        d2t = np.asarray(by_name["d2t"].data).astype(np.int64).reshape(-1)
        w2 = "markov_head.markov_w2.weight"
        tensors[w2] = rows_over_vocab(tensors[w2], d2t, int(by_name["markov_w1.weight"].shape[1]))
    extra, hp_notes = read_hparams(lambda s: get(s), n_layers, head_dim, str(path))
    notes += hp_notes
    try:
        config = DrafterConfig(
            hidden_size=n_embd, intermediate_size=int(get("feed_forward_length")), n_layers=n_layers, n_heads=n_head,
            n_kv_heads=int(get("attention.head_count_kv", n_head)), head_dim=head_dim, target_layers=taps,
            block_size=int(_required(r, flavour.block_size_keys, "block size", path)),
            mask_token_id=int(_required(r, flavour.mask_keys, "mask token id", path)),
            vocab_size=target.n_vocab if target else 0,
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)), **extra)
        config.post_norms = any(n.endswith(".post_ffw_norm.weight") for n in by_name)
        for m in (m for m in MEMBERS if m.marker in by_name):
            for key, value in m.defaults.items():              # upstream's, when the key is absent
                if getattr(config, key) is None:
                    setattr(config, key, value)
            for key, value in m.from_tensors({n: t.shape for n, t in by_name.items()}).items():
                if key in m.settings:
                    setattr(config, key, value)
            if config.member is not m and m.setting in m.keys:
                raise UserError(f"{path}: a {m.name} drafter ({m.part}) without its {flavour.arch}.{m.setting} key; "
                                "convert it from its HF checkpoint")
        missing = [k for k in config.member.keys if getattr(config, k) is None]
        if missing:
            raise UserError(f"{path}: a {config.family} drafter ({config.member.part}) without {', '.join(missing)} "
                            "in its metadata; convert it from its HF checkpoint")
    except (ValueError, TypeError) as e:
        raise UserError(f"{path}: inconsistent drafter metadata: {e}") from e
    ours = r.fields.get("dflash_gguf.target.name")
    name = r.fields.get("general.name")
    trained_for = ours.contents() if ours is not None else (
        target_from_drafter_name(name.contents()) if name is not None else None)
    n_target = r.fields.get("dflash_gguf.target.n_layer")
    if "d2t" in by_name:
        notes.append(f"reduced draft vocabulary: {int(by_name['d2t'].n_elements)} tokens (own LM head rows + d2t)")
    return DrafterSource(config, tensors, f"{flavour.name} GGUF {path}", notes, trained_for,
                         int(n_target.contents()) if n_target is not None else None, n_params=n_params,
                         draft_vocab=draft_vocab,
                         train_metadata={k: f.contents() for k, f in r.fields.items() if k.startswith("dflash_gguf.train.")})


def _draft_vocab(by_name: dict, target: TargetFile | None, path: Path) -> DraftVocab:
    """The reduced vocabulary of an upstream-schema drafter: its d2t ids and its own head rows, as stored."""
    head = by_name.get("output.weight")
    if head is None:
        raise UserError(f"{path}: has a d2t tensor but no output.weight (its own LM head); the file is incomplete")
    d2t = np.asarray(by_name["d2t"].data).astype(np.int64).reshape(-1)
    check_d2t(d2t, int(head.shape[1]), target.n_vocab if target else int(d2t.max(initial=0)) + 1, str(path))
    order = np.argsort(d2t)
    return DraftVocab(d2t[order], np.ascontiguousarray(np.asarray(head.data)[order]), head.tensor_type)
