"""`train` after its options are checked: read the target and the prompts, check the plan (preflight), harvest,
train and export."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ..errors import UserError
from .options import check_files


def run(o: SimpleNamespace) -> tuple[dict, Path]:
    """The training record of the exported drafter, and the work dir that holds its checkpoint.
    `o`: the command's options, checked (options.validate)."""
    from ..corpus.prompts import DEFAULT_PROMPTS, load
    from ..engine.session import require_native
    from ..paths import cache_root
    from ..target_file import TargetFile
    from ..textgen.chat import read_choice
    from .harvest import HarvestSettings
    from .parallel_probe import AUTO
    from .pipeline import dataset_dir, parse_taps, prompts_sha256, train_drafter
    from .preflight import dataset_feature_dtype, run_checks
    from .trainer import TrainSettings

    with TargetFile.open(o.model) as target:     # validated before torch loads or llama.cpp sees the file
        torch = _torch(o.device)
        require_native()
        check_files(o)
        prompt_files = o.prompts or [DEFAULT_PROMPTS]
        rows_in = [r for p in prompt_files for r in load(p)]
        if not rows_in:
            raise UserError("no training prompts")
        tap_ids = parse_taps(o.taps, target.n_layer)
        template_choice = read_choice(o.chat_template)
        data = o.data_dir or dataset_dir(target.sha256, prompts_sha256(rows_in), o.seed)
        if o.import_tokens is not None:
            data = data.with_name(data.name + "-imported")
        work = o.resume or o.work_dir or cache_root() / "train" / f"{o.out.stem}-{data.name}"
        top_k_probs = 0 if o.import_tokens else 8
        checked = run_checks(target, rows_in, tap_ids, n_layers=o.layers, block_size=o.block_size,
                             draft_vocab=o.draft_vocab, chat_template=template_choice, data_dir=data,
                             max_tokens=o.tokens or None, top_k_probs=top_k_probs, n_threads=o.threads,
                             n_gpu_layers=o.n_gpu_layers)
        feature_dtype = dataset_feature_dtype(data, checked.feature_dtype)
        if o.import_tokens is not None:
            from .refeature import import_tokens as rebuild
            rebuild(o.import_tokens, target, data, n_threads=o.threads, feature_dtype=feature_dtype)
        if o.threads:
            torch.set_num_threads(o.threads)
        settings = TrainSettings(n_layers=o.layers, block_size=o.block_size, epochs=o.epochs, rows=o.rows, lr=o.lr,
                                 device=o.device, seed=o.seed, precision=o.precision, distill=o.distill,
                                 tv=o.tv, cut_at_first_error=o.cut_at_first_error,
                                 supervised_slots=o.supervised_slots, short_blocks=o.short_blocks,
                                 markov_rank=o.markov_rank, confidence_head=o.confidence_head,
                                 max_seconds=o.max_minutes * 60 if o.max_minutes else None,
                                 schedule_seconds=o.schedule_minutes * 60 if o.schedule_minutes else None,
                                 loss_vocab_extra=None if o.loss_vocab_extra < 0 else o.loss_vocab_extra)
        harvest_settings = HarvestSettings(taps=tap_ids, seed=o.seed, n_threads=o.threads, n_parallel=AUTO if o.parallel == "auto" else int(o.parallel),
                                           processes=o.harvest_processes, n_gpu_layers=o.n_gpu_layers,
                                           top_k_probs=top_k_probs, feature_dtype=feature_dtype,
                                           chat_template=checked.template.text if checked.template else None)
        record = train_drafter(target, o.out, rows_in, work, taps=tap_ids, harvest_settings=harvest_settings,
                               train_settings=settings, max_tokens=o.tokens or None, outtype=o.outtype,
                               resume=o.resume is not None, force=o.force,
                               data_note=", ".join(str(p) for p in prompt_files),
                               draft_vocab=o.draft_vocab, data_dir=data,
                               harvest_seconds=o.harvest_minutes * 60 if o.harvest_minutes else None,
                               init_drafter=o.init_drafter,
                               chat_template_source=checked.template.source if checked.template else None)
        return record, work


def run_adapt(o: SimpleNamespace) -> tuple[dict, Path]:
    """`train --adapt`: the record of the adapted drafter, and the work dir that holds its data and checkpoint."""
    import hashlib
    import time

    started = time.time()               # --max-minutes bounds the command from here, torch's import included

    from ..engine.session import require_native
    from ..paths import cache_root
    from ..target_file import TargetFile
    from .adapt import AdaptSettings, adapt, check_paths

    if not o.model.is_file():
        raise UserError(f"-m {o.model}: no such file")
    check_paths(o.model_draft, o.out, o.force)
    with TargetFile.open(o.model) as target:
        torch = _torch(o.device)
        require_native()
        if o.threads:
            torch.set_num_threads(o.threads)
        store = o.adapt.resolve()
        key = hashlib.sha256(f"{store}|{o.model_draft.resolve()}".encode()).hexdigest()[:12]
        work = o.resume or o.work_dir or cache_root() / "adapt" / f"{o.out.stem}-{key}"
        settings = AdaptSettings(minutes=o.max_minutes or 20.0, replay=o.replay, lr=o.lr, seed=o.seed, rows=o.rows,
                                 threads=o.threads, prompts=tuple(o.prompts), eval_per_category=o.eval_prompts,
                                 general_drop=o.general_drop, replay_dir=o.data_dir, tv=o.tv,
                                 blends=o.blend_shares)
        record = adapt(target, o.model_draft, o.out, o.adapt, work, settings, force=o.force,
                       resume=o.resume is not None, started=started)
        return record, work


def _torch(device: str):
    try:
        import torch
    except ImportError:
        raise UserError("training needs PyTorch: pip install 'dflash-gguf[train]' (torch==2.13.0)") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    return torch
