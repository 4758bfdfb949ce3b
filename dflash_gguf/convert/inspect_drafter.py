"""What `dflash-gguf inspect` reports about a drafter GGUF (header only: no weights, no native library)."""

from __future__ import annotations

from pathlib import Path

from ..drafter.config import config_fit_problems
from ..gguf_reader import open_gguf
from ..target_file import TargetFile
from .checks import fit_warnings
from .flavours import detect_flavour, normalize_gguf


def inspect_drafter(path: Path, target: Path | None = None) -> dict:
    """Geometry, DFlash settings, training metadata and (with `target`) whether it fits, as a flat dict."""
    flavour = detect_flavour(path)
    tinfo = TargetFile.open(target) if target else None
    src = normalize_gguf(path, flavour, tinfo, load_tensors=False)
    c = src.config
    fields = open_gguf(path).fields
    report = {
        "file": str(path), "size_mib": round(path.stat().st_size / 2**20, 2), "flavour": flavour.name,
        "family": c.family,
        "layers": c.n_layers, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "heads": f"{c.n_heads} q / {c.n_kv_heads} kv x {c.head_dim}", "parameters": src.n_params,
        "target_layers": c.target_layers, "block_size": c.block_size, "mask_token_id": c.mask_token_id,
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling, "sliding_window": c.sliding_window,
        "layer_types": c.layer_types, "embedding_scale": c.embedding_scale,
        "draft_vocab": _draft_vocab_size(path) or "full (the target's LM head)",
        "trained_for": src.trained_for, "notes": src.notes, **c.member_settings(),
        "training": {k.removeprefix("dflash_gguf.train."): f.contents() for k, f in fields.items()
                     if k.startswith("dflash_gguf.train.")},
    }
    if tinfo is not None:
        problems = config_fit_problems(c, tinfo)
        report["fits_target"] = not problems
        if problems:
            report["fit_problem"] = "; ".join(problems)
        report["warnings"] = fit_warnings(c, tinfo, src.trained_for, src.num_target_layers)
    return report


def _draft_vocab_size(path: Path) -> int | None:
    d2t = next((t for t in open_gguf(path).tensors if t.name == "d2t"), None)
    return int(d2t.n_elements) if d2t is not None else None

