"""Prompt files: JSONL rows with `prompt` (+ `category`, `format`, `source`), optionally gzip-compressed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_PROMPTS = DATA / "prompts-v2.jsonl.gz"     # the training set (lab/make_train_prompts.py)
FIRST_PROMPTS = DATA / "prompts.jsonl"             # the first, smaller set: draft-vocabulary counts, tests


def load(path: Path) -> list[dict]:
    """Rows of a JSONL prompt file (gzip-compressed when its name ends in .gz)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
