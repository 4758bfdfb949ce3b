"""Write one validated `dflash` GGUF (the schema upstream llama.cpp loads) from z-lab-named tensors.

Written to a temporary file beside the output, validated against the target and by loading it
through the native layer, then renamed: an error never leaves a partial file behind.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from .. import gguf_family
from ..drafter.config import DrafterConfig
from ..target_file import TargetFile
from .checks import ConvertError, check_config_fits, check_shapes
from ..drafter.draft_vocab import DraftVocab
from .hparams import write_hparams
from ..drafter.tensor_names import gguf_tensor_name

__all__ = ["ARCH", "OUTTYPES", "ConvertError", "add_decoder_hparams", "add_target_tokenizer", "finish", "write_dflash_gguf"]

ARCH = "dflash"
OUTTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
K_QUANTS = {"q4_k": "q4_k_m", "q5_k": "q5_k_m", "q6_k": "q6_k"}    # --outtype → llama_ftype name
_SMALL = 4096        # tensors with fewer elements stay F32 (norms; quantizing them saves nothing)
_W2 = "markov_head.markov_w2.weight"     # DSpark: [V, R] in our tensor dicts, the draft vocabulary's rows in a file


def _encode(arr: np.ndarray, outtype: str, name: str = "") -> tuple[np.ndarray, object]:
    """(data, raw ggml type or None) for one tensor at `outtype`; norms, small tensors and the ones
    ggml needs in F32 (gguf_family.F32_ONLY) stay F32."""
    import gguf  # noqa: PLC0415
    if arr.ndim < 2 or arr.size < _SMALL or outtype == "f32" or outtype in K_QUANTS \
            or any(s in name for s in gguf_family.F32_ONLY):                          # K-quants: by llama.cpp
        return arr.astype(np.float32), None
    if outtype == "f16":
        return arr.astype(np.float16), None
    qtype = getattr(gguf.GGMLQuantizationType, outtype.upper())
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if arr.shape[-1] % block:                                       # rows not a whole number of blocks: F16
        return arr.astype(np.float16), None
    return gguf.quants.quantize(arr.astype(np.float32), qtype), qtype


def add_decoder_hparams(w, *, n_layer: int, n_ctx: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                        head_dim: int, rms_eps: float, rope_base: float) -> None:
    """The hyperparameters every llama-like decoder (and a `dflash` drafter) reads."""
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_rope_freq_base(rope_base)


def add_target_tokenizer(w, target: TargetFile, mask_token_id: int) -> None:
    """The target's tokenizer keys, types kept, with the drafter's mask token."""
    for key, f in target.header.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.ggml.mask_token_id":
            w.add_key_value(key, f.value, f.types[0], sub_type=f.types[1] if len(f.types) > 1 else None)
    w.add_uint32("tokenizer.ggml.mask_token_id", mask_token_id)


def finish(w, progress: bool = False) -> None:
    """Header, key-values, tensors, in the order a GGUF file holds them."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=progress)
    w.close()


def _write(tensors: dict[str, np.ndarray], config: DrafterConfig, target: TargetFile, path: Path, outtype: str,
           extra_metadata: dict | None, name: str, draft_vocab: DraftVocab | None) -> None:
    import gguf  # noqa: PLC0415
    c = config
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name(name)
    add_decoder_hparams(w, n_layer=c.n_layers, n_ctx=target.n_ctx_train or 4096, n_embd=c.hidden_size,
                        n_ff=c.intermediate_size, n_head=c.n_heads, n_head_kv=c.n_kv_heads, head_dim=c.head_dim,
                        rms_eps=c.rms_eps, rope_base=c.rope_theta)
    w.add_rope_dimension_count(c.head_dim)
    write_hparams(w, ARCH, c)
    w.add_uint32(f"{ARCH}.block_size", c.block_size)
    w.add_array(f"{ARCH}.target_layers", [int(t) for t in c.target_layers])
    add_target_tokenizer(w, target, c.mask_token_id)
    w.add_string("dflash_gguf.target.name", target.name)
    w.add_string("dflash_gguf.target.architecture", target.arch)
    w.add_uint32("dflash_gguf.target.n_layer", target.n_layer)
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_int64(key, value)
        elif isinstance(value, float):
            w.add_float64(key, value)
        else:
            w.add_string(key, str(value))
    for hf_name, arr in tensors.items():
        name = gguf_tensor_name(hf_name)
        data, qtype = _encode(np.asarray(arr), outtype, name)
        w.add_tensor(name, data, raw_dtype=qtype)
    if draft_vocab is not None:         # the drafter's own head: the target's rows, as stored there
        rows = draft_vocab.head_rows
        if rows.dtype not in (np.float32, np.float16):
            rows = rows.view(np.uint8).reshape(draft_vocab.size, -1)
        w.add_tensor("output.weight", rows, raw_dtype=draft_vocab.head_type)
        w.add_tensor("d2t", draft_vocab.token_ids.astype(np.int64))
    finish(w, progress=sum(np.asarray(a).size for a in tensors.values()) > 50_000_000)


def write_dflash_gguf(tensors: dict[str, np.ndarray], config: DrafterConfig, target: TargetFile | Path,
                      out_path: Path, outtype: str = "f16", extra_metadata: dict | None = None, force: bool = False,
                      name: str = "dflash-drafter", source: str = "drafter", validate: bool = True,
                      draft_vocab: DraftVocab | None = None) -> Path:
    """tensors: z-lab names → float32 [out, in]; the output fits `target` (a TargetFile, or its path: checked)
    and loads in llama.cpp (the target's shared model serves the load check).
    With `draft_vocab` the drafter proposes only those tokens, through its own copy of their head rows (and a
    DSpark W2, given over the whole vocabulary, keeps only their rows)."""
    out_path = Path(out_path)
    if outtype not in OUTTYPES:
        raise ConvertError(f"--outtype {outtype}: choose one of {', '.join(OUTTYPES)}")
    if out_path.exists() and not force:
        raise ConvertError(f"{out_path} exists; pass --force to overwrite it")
    opened = not isinstance(target, TargetFile)         # a path: opened, and its model freed, here
    target = TargetFile.open(target) if opened else target
    check_config_fits(config, target, source)
    check_shapes(tensors, config, source, target.n_vocab)
    if draft_vocab is not None and not config.member.draft_vocab:
        raise ConvertError(f"{source}: a {config.family} drafter with a reduced draft vocabulary (d2t) is not "
                           "supported; convert it without --draft-vocab")
    if draft_vocab is not None and draft_vocab.token_ids.max(initial=-1) >= target.n_vocab:
        raise ConvertError(f"{source}: its draft vocabulary has token ids beyond the target's {target.n_vocab}")
    if draft_vocab is not None and _W2 in tensors:      # DSpark: W2 gives a bias per head row (gguf_family)
        tensors = {**tensors, _W2: np.asarray(tensors[_W2])[draft_vocab.token_ids]}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.part")
    try:
        _write(tensors, config, target, tmp, "f32" if outtype in K_QUANTS else outtype, extra_metadata, name,
               draft_vocab)
        if outtype in K_QUANTS:
            from ..native.quantize import llama_quantize  # noqa: PLC0415
            llama_quantize(tmp, tmp, K_QUANTS[outtype])
        if validate:
            from .validate import load_check  # noqa: PLC0415
            load_check(tmp, target, config, None if draft_vocab is None else draft_vocab.token_ids)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
        if opened:
            target.close()
    before = sum(np.asarray(a).size * 4 for a in tensors.values())
    print(f"wrote {out_path} ({outtype}): {before / 2**20:.1f} MiB as F32 -> {out_path.stat().st_size / 2**20:.1f} MiB",
          file=sys.stderr)
    return out_path
