"""Load-check a written drafter through llama.cpp: metadata reads back, one injection + one draft step run."""

from __future__ import annotations

from contextlib import ExitStack, closing
from pathlib import Path

import numpy as np

from ..drafter.config import DrafterConfig
from ..errors import UserError
from ..target_file import TargetFile


def load_check(drafter_path: Path, target: TargetFile, config: DrafterConfig,
               vocab_ids: np.ndarray | None = None) -> None:
    """Raise UserError unless llama.cpp loads `drafter_path`, reads back its taps / block size / mask token,
    and drafts one block with finite logits after injecting a few context rows (ctx_other = a context of
    the target's shared model).
    With a reduced draft vocabulary (`vocab_ids`) exactly those logits are finite, the others -inf."""
    from ..engine.drafter_driver import DrafterDriver  # noqa: PLC0415
    from ..native.wrappers import Context, ContextSettings, DecodeError, Model, ModelLoadError  # noqa: PLC0415
    with ExitStack() as stack:
        try:
            target_model = target.model()
            drafter = stack.enter_context(closing(Model(drafter_path)))
        except ModelLoadError as e:
            raise UserError(f"the written drafter does not load in llama.cpp: {e}") from e
        got = (drafter.target_layer_ids(), drafter.block_size(), drafter.mask_token())
        want = (list(config.target_layers), config.block_size, config.mask_token_id)
        if got != want:
            raise UserError(f"the written drafter reads back as (taps, block, mask) = {got}, expected {want}")
        n_ctx = 4             # context rows injected before the block
        settings = ContextSettings(n_ctx=64, n_batch=32, n_ubatch=max(32, config.block_size), n_threads=1)
        tctx = stack.enter_context(closing(Context(target_model, settings)))
        driver = stack.enter_context(closing(DrafterDriver(drafter, tctx, settings)))
        feats = np.random.default_rng(0).standard_normal((n_ctx, driver.width)).astype(np.float32)
        try:
            driver.inject(feats, 0)
            driver.decode_block(0, n_ctx, config.block_size)
        except DecodeError as e:
            raise UserError(f"{drafter_path.name}: llama.cpp cannot run the written drafter: {e}") from e
        logits = np.asarray(driver.logits(config.block_size))
        inside = np.ones(logits.shape[1], bool) if vocab_ids is None else np.isin(np.arange(logits.shape[1]), vocab_ids)
        if not np.isfinite(logits[:, inside]).all():
            raise UserError(f"{drafter_path.name}: draft logits are not finite; the weights are damaged")
        if not np.all(logits[:, ~inside] == -np.inf):
            raise UserError(f"{drafter_path.name}: tokens outside its draft vocabulary got finite logits; "
                            "the d2t mapping is damaged")

