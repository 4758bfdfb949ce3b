"""Prompt files: JSONL rows with `prompt` (+ `category`, `format`, `source`), optionally gzip-compressed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_PROMPTS = DATA / "prompts-v2.jsonl.gz"     # the training set (lab/make_train_prompts.py)
FIRST_PROMPTS = DATA / "prompts.jsonl"             # the first, smaller set: draft-vocabulary counts, tests
EVERYDAY_PROMPTS = DATA / "everyday-mix.jsonl.gz"  # what chat apps are asked (lab/make_everyday_mix.py)
# the everyday mix's own rows (not its replay of the default set), by source prefix, and their category
EVERYDAY_KINDS = {"everyday:": "chat", "template:story": "math"}


def load(path: Path) -> list[dict]:
    """Rows of a JSONL prompt file (gzip-compressed when its name ends in .gz)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]

# The shipped drafter's first harvest took the default set in order and stopped at 6,408 sequences (--tokens 1400000,
# dflash_gguf/assets/README.md): its first TRAINED_PART prompts are what it was trained on, and prompts from
# HELD_BACK_FROM on were never its training data.
TRAINED_PART = 6408
HELD_BACK_FROM = 8000


def family(row: dict) -> str:
    """A prompt's family: its math template, code module, package section or request template ("template:24",
    "cpython:email.utils", "debian-packages:database", "everyday:topic"); a self-instruct question, or a row without a
    source, is its own."""
    source = row.get("source", "")
    if not source:
        return "prompt:" + row.get("prompt", json.dumps(row.get("messages"), sort_keys=True))
    if source.startswith("self-instruct"):
        return source
    return ":".join(source.split(":")[:2])


def general_set(rows: list[dict], per_category: int) -> list[dict]:
    """A fixed mix of `rows`, `per_category` of each category from as many families (family()), taken from the end
    (for the default set: of its held-back part), each with its index in `rows` as `id` unless it has one: τ on it
    tells whether a drafter adapted to one kind of traffic got worse elsewhere. `train --adapt` replays none of these
    families (adapt.prompt_sets): a family the replay holds is protected by it and fell half as much as one it does
    not hold, which is what ../shared/prompts is to the replay (docs/learning.md)."""
    picked: dict[str, list[dict]] = {}
    families = set()
    for i in range(len(rows) - 1, -1, -1):
        cat, kin = rows[i].get("category", "chat"), family(rows[i])
        if kin not in families and len(picked.setdefault(cat, [])) < per_category:
            families.add(kin)
            picked[cat].append({"id": i, **rows[i]})
    return [r for cat in sorted(picked) for r in picked[cat]]


def everyday_rows() -> list[dict]:
    """The everyday mix's own rows (everyday requests, story problems; not its replay of the default set), each with
    `id` "everyday-mix:<index>" and its category."""
    out = []
    for i, r in enumerate(load(EVERYDAY_PROMPTS)):
        kind = next((k for k in EVERYDAY_KINDS if r.get("source", "").startswith(k)), None)
        if kind is not None:
            out.append({**r, "id": f"everyday-mix:{i}", "category": EVERYDAY_KINDS[kind]})
    return out


def everyday_set(per_kind: int) -> list[dict]:
    """The last `per_kind` single-turn everyday requests (chat) and story problems (math) of the everyday mix, each
    with `id` "everyday-mix:<index>": requests like what chat apps are asked, which the default set's held-back part
    (general_set) holds little of. A drafter adapted to one persona fell 0.07 τ on ../shared/prompts and 0.08 on 40
    of these while the default set's held-back part moved 0.02 (docs/learning.md)."""
    picked: dict[str, list[dict]] = {}
    for r in reversed(everyday_rows()):
        if not r.get("followups") and len(picked.setdefault(r["category"], [])) < per_kind:
            picked[r["category"]].append(r)
    return [r for category in EVERYDAY_KINDS.values() for r in picked.get(category, [])]
