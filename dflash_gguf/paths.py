"""Where dflash-gguf keeps downloads, native builds and measurements (never inside the repo)."""

from __future__ import annotations

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
