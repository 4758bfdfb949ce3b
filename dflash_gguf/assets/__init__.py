"""Drafters shipped inside the package, and how a target finds its drafter.

`drafters.json` (beside this file) lists them: [{"file": "<name>.gguf", "sha256": "...",
"target": {"name": "<general.name of the target>", "architecture": "llama", "n_embd": 576,
"n_layer": 30, "n_vocab": 49152}, ...training record...}]. A drafter fits a target whose GGUF
header has the same architecture, hidden size, layer count and vocabulary size.
"""

from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).resolve().parent


def manifest() -> list[dict]:
    path = ASSETS / "drafters.json"
    return json.loads(path.read_text()) if path.exists() else []


def target_signature(target: Path) -> dict:
    """Architecture, hidden size, layer count and vocabulary size from a GGUF header (no weights loaded)."""
    from ..gguf_check import parse_header  # noqa: PLC0415

    h = parse_header(target)
    arch = h.arch
    return {"architecture": arch, "n_embd": h.value(f"{arch}.embedding_length"),
            "n_layer": h.value(f"{arch}.block_count"), "n_vocab": h.n_vocab()}


def shipped_drafter_for(target: Path) -> Path | None:
    entries = manifest()
    if not entries:
        return None
    sig = target_signature(target)
    for entry in entries:
        want = entry["target"]
        if all(want.get(k) == sig[k] for k in ("architecture", "n_embd", "n_layer", "n_vocab")):
            path = ASSETS / entry["file"]
            if path.exists():
                return path
    return None
