"""The one in-memory form every drafter source is read into before it is written as upstream `dflash`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..drafter.config import DrafterConfig
from ..drafter.draft_vocab import DraftVocab


@dataclass
class DrafterSource:
    config: DrafterConfig
    tensors: dict[str, np.ndarray]                   # z-lab names, float32, torch layout [out, in]
    description: str                                 # "z-lab folder …", "dflash-draft GGUF …"
    notes: list[str] = field(default_factory=list)   # what normalisation did (printed by convert)
    trained_for: str | None = None                   # the target the source names, if it names one
    num_target_layers: int | None = None             # the target depth the source was built for, if known
    n_params: int = 0                                # parameters (known even when tensors were not loaded)
    draft_vocab: DraftVocab | None = None            # a reduced draft vocabulary the source already has
    train_metadata: dict = field(default_factory=dict)   # dflash_gguf.train.* of a drafter we trained


def target_from_drafter_name(name: str) -> str | None:
    """"Qwen3-8B-DFlash-b16" → "Qwen3-8B": z-lab and most uploaders name a drafter after its target."""
    parts = re.split(r"[-_. ]dflash", name, maxsplit=1, flags=re.IGNORECASE)
    return parts[0] if len(parts) == 2 and parts[0] else None


def same_model_name(a: str, b: str) -> bool:
    """Loose match of two model names ("Qwen3-8B" vs "Qwen3 8B" / "qwen3-8b-q4_k_m.gguf")."""
    na, nb = (re.sub(r"[^0-9a-z]", "", s.lower()) for s in (a, b))
    return bool(na) and bool(nb) and (na in nb or nb in na)
