"""Open the draft source a drafter GGUF calls for: one class per member of the DFlash family."""

from __future__ import annotations

from ..gguf_check import drafter_member, parse_header
from ..gguf_family import DFLASH2, DSPARK
from ..native.wrappers import Context, ContextSettings, Model
from .dflash2 import DFlash2Drafter
from .drafter import DFlashDrafter
from .dspark import DSparkDrafter

DRAFTERS = {DFLASH2: DFlash2Drafter, DSPARK: DSparkDrafter}


def open_drafter(model: Model, target_ctx: Context, settings: ContextSettings, target_model: Model,
                 *, window: int | None = None) -> DFlashDrafter:
    """DFlashDrafter, DFlash2Drafter or DSparkDrafter, as the file's tensors say (gguf_family.MARKERS)."""
    cls = DRAFTERS.get(drafter_member(parse_header(model.path)), DFlashDrafter)
    return cls(model, target_ctx, settings, target_model, window=window)
