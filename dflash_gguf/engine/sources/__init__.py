"""Draft sources behind one interface (base.py): the DFlash family (dflash.py, dflash2.py, dspark.py), each a
drafter GGUF run by llama.cpp, and prompt lookup (lookup.py), which needs no drafter file."""

from __future__ import annotations

from ...gguf_check import drafter_member, parse_header
from ...gguf_family import DFLASH, DFLASH2, DSPARK
from ...native.wrappers import Context, ContextSettings, Model
from .dflash import DFlashSource
from .dflash2 import DFlash2Source
from .dspark import DSparkSource

FAMILY_SOURCES = {DFLASH: DFlashSource, DFLASH2: DFlash2Source, DSPARK: DSparkSource}   # gguf_family.Member → class


def open_drafter(model: Model, target_ctx: Context, settings: ContextSettings, target_model: Model,
                 *, window: int | None = None) -> DFlashSource:
    """The source for the drafter's family member, as the file's tensors say (gguf_family.member_of)."""
    cls = FAMILY_SOURCES[drafter_member(parse_header(model.path))]
    return cls(model, target_ctx, settings, target_model, window=window)
