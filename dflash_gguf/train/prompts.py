"""Prompt files: JSONL rows with `prompt` (+ `category`, `format`, `source`), optionally gzip-compressed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def load(path: Path) -> list[dict]:
    """Rows of a JSONL prompt file (gzip-compressed when its name ends in .gz)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
