"""Everything `train` needs, checked in its first seconds: a problem is one line before any token is harvested.

Checks, in order: the drafter's shape against the target and the export (DrafterConfig rules, config_fit_problems),
the draft vocabulary, the chat template (when any prompt is a chat), the taps and the range of the target's
hidden states on a few real prompts (which also picks the features' storage dtype), and the disk space the
harvest will write.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..target_file import TargetFile
from . import features as fx

PROBE_PROMPTS = 2             # per category: enough for the range of the hidden states (their outliers sit
PROBE_TOKENS = 96            # near the start of a text), in a few seconds


@dataclass
class Preflight:
    feature_dtype: str
    template: object | None       # textgen.chat.ChatTemplate, or None when no prompt is a chat
    max_abs: list[float]          # per tap, over the probe prompts
    bytes_needed: int

    def summary(self) -> str:
        tpl = f"chat template: {self.template.source}" if self.template else "no chat prompts"
        return (f"checked: {tpl}; tap max |x| {', '.join(f'{x:.4g}' for x in self.max_abs)} → features stored as "
                f"{self.feature_dtype}; the harvest needs ~{self.bytes_needed / 2**30:.1f} GiB of disk")


def check_shape(target: TargetFile, taps: list[int], n_layers: int, block_size: int, draft_vocab: int | None) -> None:
    """The drafter this run would export is a valid one for this target."""
    from ..drafter.config import config_fit_problems  # noqa: PLC0415
    from .pipeline import drafter_config  # noqa: PLC0415
    if target.n_ff <= 0:
        raise UserError(f"-m {target.path}: the GGUF gives no {target.arch}.feed_forward_length; the drafter's MLP "
                        "width cannot be chosen")
    try:
        config = drafter_config(target, taps, n_layers, block_size)
    except ValueError as e:
        raise UserError(f"-m {target.path}: a drafter of this target's shape is not valid ({e})") from None
    problems = config_fit_problems(config, target)
    if problems:
        raise UserError(f"-m {target.path}: the drafter would not fit its target: {'; '.join(problems)}")
    if draft_vocab is not None and not 2 <= draft_vocab <= target.n_vocab:
        raise UserError(f"--draft-vocab {draft_vocab}: choose 2..{target.n_vocab} (the target's vocabulary)")


def run_checks(target: TargetFile, prompts: list[dict], taps: list[int], *, n_layers: int, block_size: int,
               draft_vocab: int | None, chat_template: str | None, data_dir: Path, max_tokens: int | None,
               top_k_probs: int, n_threads: int = 0, n_gpu_layers: int = 0) -> Preflight:
    from ..textgen.chat import model_template  # noqa: PLC0415
    from ..textgen.prompting import format_prompt, is_completion  # noqa: PLC0415
    check_shape(target, taps, n_layers, block_size, draft_vocab)
    model = target.model(n_gpu_layers)
    chats = [r for r in prompts if not is_completion(r)]
    template = model_template(model, chat_template) if chats else None
    max_abs = _tap_range(model, [format_prompt(model, r, template.text if template else None)[:PROBE_TOKENS]
                                 for r in _probe_rows(prompts)], taps, target.path, n_threads)
    dtype = fx.choose_dtype(max(max_abs))
    tokens = max_tokens or 400 * len(prompts)
    per_token = fx.BYTES[dtype] * len(taps) * target.n_embd + 4 + top_k_probs * 6
    need = int(tokens * per_token * 1.05)
    data_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(data_dir).free + _size(data_dir)
    if need > free:
        raise UserError(f"{data_dir}: the harvest needs ~{need / 2**30:.1f} GiB ({tokens:,} tokens × {per_token:,} "
                        f"bytes) and {free / 2**30:.1f} GiB are free; lower --tokens or pass --data-dir elsewhere")
    result = Preflight(dtype, template, max_abs, need)
    print(result.summary(), file=sys.stderr)
    return result


def dataset_feature_dtype(data_dir: Path, wanted: str) -> str:
    """The dtype a harvest into `data_dir` stores: the folder's own when it holds data already (a resumed
    harvest), refused when that cannot hold this target's hidden states."""
    import json  # noqa: PLC0415
    meta = data_dir / "meta.json"
    if not meta.exists():
        return wanted
    have = json.loads(meta.read_text()).get("feature_dtype", "float16")
    if have == "float16" and wanted != "float16":
        raise UserError(f"{data_dir} stores features as float16, which this target's hidden states overflow; "
                        "delete that folder or pass another --data-dir")
    return have


def _probe_rows(prompts: list[dict]) -> list[dict]:
    per_cat: dict = {}
    for r in prompts:
        per_cat.setdefault(r.get("category"), [])
        if len(per_cat[r.get("category")]) < PROBE_PROMPTS:
            per_cat[r.get("category")].append(r)
    return [r for rows in per_cat.values() for r in rows]


def _tap_range(model, seqs: list[list[int]], taps: list[int], target_path: Path, n_threads: int) -> list[float]:
    """Largest |value| of each tap over the probe sequences; refuses taps llama.cpp cannot give and non-finite
    hidden states."""
    from ..native.wrappers import Batch, Context, ContextSettings, DecodeError, TapError  # noqa: PLC0415
    from ..textgen.greedy import prefill_features  # noqa: PLC0415
    ctx = Context(model, ContextSettings(n_ctx=PROBE_TOKENS + 16, n_batch=PROBE_TOKENS, n_ubatch=PROBE_TOKENS,
                                         n_threads=n_threads))
    batch = Batch(model.native, PROBE_TOKENS)
    try:
        best = np.zeros(len(taps))
        for seq in seqs:
            try:
                feats = prefill_features(ctx, batch, taps, seq).reshape(len(seq), len(taps), -1)
            except (DecodeError, TapError) as e:
                raise UserError(f"-m {target_path}: llama.cpp cannot tap layers {taps} of this "
                                f"{model.arch} target ({e}); see the README's supported targets") from None
            if not np.isfinite(feats).all():
                raise UserError(f"-m {target_path}: the target's hidden states at taps {taps} hold inf/NaN on a "
                                "training prompt; the file is damaged or its arithmetic overflows")
            best = np.maximum(best, np.abs(feats).max(axis=(0, 2)))
        return [float(x) for x in best]
    finally:
        batch.close()
        ctx.close()


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.bin")) if folder.is_dir() else 0
