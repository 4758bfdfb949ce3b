"""Where dflash-gguf keeps downloads, native builds and measurements (never inside the repo), and file digests."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


def cache_root() -> Path:
    """The user cache dir: $DFLASH_GGUF_CACHE, else XDG / platform default."""
    override = os.environ.get("DFLASH_GGUF_CACHE")
    if override:
        return Path(override).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "dflash-gguf"


def repo_root() -> Path | None:
    """The source checkout this package runs from (editable installs), or None."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "patches").is_dir() and (root / "pyproject.toml").is_file() else None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
