"""harvest → train → export: a drafter for any GGUF target, from the target alone."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ..drafter.config import DrafterConfig, official_target_layer_ids
from ..errors import UserError
from ..paths import sha256_file as file_sha256
from ..target_file import TargetFile
from .harvest import HarvestSettings
from .trainer import Trainer, TrainSettings


def read_drafter(path: Path, target: TargetFile):
    """A drafter file to continue from (any checkpoint format convert reads), checked against its target."""
    from ..convert.checkpoint_formats import read_source  # noqa: PLC0415
    return read_source(str(path), target)


def auto_taps(n_target_layers: int, n_taps: int = 4) -> list[int]:
    """The official tap formula (HF layer ids) shifted to llama.cpp tap ids (+1)."""
    return [i + 1 for i in official_target_layer_ids(n_target_layers, n_taps)]


def parse_taps(spec: str, n_target_layers: int) -> list[int]:
    if spec == "auto":
        return auto_taps(n_target_layers)
    try:
        taps = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--taps {spec!r}: expected 'auto' or comma-separated layer ids like 2,11,19,28") from None
    bad = [t for t in taps if not 0 <= t <= n_target_layers]
    if bad or not taps:
        raise UserError(f"--taps {spec!r}: ids must be in 0..{n_target_layers} for this target")
    return taps


def drafter_config(target: TargetFile, taps: list[int], n_layers: int, block_size: int) -> DrafterConfig:
    """Same attention/MLP geometry as the target's layers, so draft layers can start as target layers, and the
    target's embedding scale, activation and norms (arch_traits.py)."""
    from .arch_traits import traits  # noqa: PLC0415
    arch = traits(target.arch, target.n_embd)
    return DrafterConfig(hidden_size=target.n_embd, intermediate_size=target.n_ff, n_layers=n_layers,
                         n_heads=target.n_head, n_kv_heads=target.n_head_kv, head_dim=target.head_dim,
                         target_layers=taps, block_size=block_size, mask_token_id=target.mask_token,
                         vocab_size=target.n_vocab, rms_eps=target.rms_eps,
                         rope_theta=target.rope_theta if target.rope_theta is not None else 10000.0,
                         embedding_scale=arch.embedding_scale, hidden_act=arch.hidden_act,
                         post_norms=arch.post_norms)


def prompts_sha256(prompts: list[dict]) -> str:
    h = hashlib.sha256()
    for r in prompts:
        h.update(json.dumps(r, sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest()


def dataset_dir(target_sha: str, prompts_sha: str, seed: int) -> Path:
    """Where the harvest of this target, prompt set and seed lives (resumed by any later run)."""
    from ..paths import cache_root  # noqa: PLC0415
    return cache_root() / "datasets" / f"{target_sha[:16]}-{prompts_sha[:12]}-s{seed}"


def build_trainer(target: TargetFile, data, settings: TrainSettings, draft_vocab: int | None = None,
                  init_drafter: Path | None = None):
    """(Trainer, draft vocabulary or None) for `target` on a harvested dataset; the draft vocabulary, when
    asked for, is the K tokens the target wrote most in the training sequences. `init_drafter`: start from
    the weights of a drafter GGUF of this target (e.g. one trained on a GPU) instead of the target's layers."""
    from .frozen_weights import embedding_and_head, layer_init  # noqa: PLC0415
    config = drafter_config(target, data.taps, settings.n_layers, settings.block_size)
    embed, head = embedding_and_head(target)
    src = read_drafter(init_drafter, target) if init_drafter is not None else None
    vocab = None
    if draft_vocab and src is not None and src.draft_vocab is not None and src.draft_vocab.size == draft_vocab:
        # A continued drafter keeps the vocabulary its layers were trained to propose. Counted afresh on the new
        # data instead, it dropped what the new prompts write less of: the shipped SmolLM2 drafter continued on
        # the everyday mix measured τ 2.202 on the shipped set's held-back part with a recount, 2.308 with its own
        # (docs/measurements.md), the same weights; at 4,096 of 49,152 tokens either covers the new data alike.
        vocab = src.draft_vocab
    elif draft_vocab:
        from ..drafter import draft_vocab as dv  # noqa: PLC0415
        counts = np.bincount(data.written_tokens(data.split()[0]), minlength=embed.shape[0])
        vocab = dv.build(target, counts, draft_vocab, target.eog_ids)
    init = layer_init(target, max(data.taps), settings.n_layers) if settings.init_from_target else None
    trainer = Trainer(data, config, embed, head, settings, init,
                      draft_vocab=vocab.token_ids if vocab is not None else None)
    trainer.arch = target.arch
    if src is not None:
        trainer.load_weights(src.tensors, str(init_drafter))
        trainer.init_record = init_record(init_drafter, src.train_metadata)
    return trainer, vocab


def init_record(path: Path, train_metadata: dict) -> dict:
    """What a drafter we continue had been trained on (its dflash_gguf.train.* keys), so that rows and
    tokens can be counted from the very start: {file, labelled_rows, response_tokens, dataset}."""
    get = {k.removeprefix("dflash_gguf.train."): v for k, v in train_metadata.items()}
    before = {"file": path.name, "sha256": file_sha256(path)}
    for key in ("labelled_rows", "response_tokens", "dataset", "init_drafter"):
        if key in get:
            before[key] = get[key]
    before["labelled_rows_in_all"] = int(get.get("labelled_rows_in_all", get.get("labelled_rows", 0)))
    before["response_tokens_in_all"] = int(get.get("response_tokens_in_all", get.get("response_tokens", 0)))
    return before


def training_record(trainer: Trainer, result) -> dict:
    """What a training run did and reached (`result`: its last validation), under the names the train record,
    drafters.json and the GGUF's dflash_gguf.train.* keys use."""
    return {"steps": trainer.step, "labelled_rows": trainer.rows_seen,
            "train_seconds": round(trainer.seconds_before, 1),
            "rows_per_second": round(trainer.rows_seen / max(trainer.seconds_before, 1e-9), 1),
            "precision": str(trainer.autocast or "float32").removeprefix("torch."),
            "val_loss": result.loss, "val_tau_estimate": result.tau, "val_anchor_tau": result.anchor_tau,
            "val_slot_accept": result.slot_accept, "markov_rank": trainer.config.markov_rank}


def drafter_name(target: TargetFile, family: str) -> str:
    """general.name of a trained drafter: its target's own name, if the target has one. llama.cpp's vocabulary
    loader sets token attributes by model name (e.g. names with "phi3"), so the drafter's name never makes it
    treat the shared vocabulary otherwise than the target's."""
    name = target.header.value("general.name")
    return f"{name} {family} drafter" if name is not None else f"{family} drafter"


def export(trainer: Trainer, target: TargetFile, out: Path, record: dict, vocab=None, *, outtype: str = "q8_0",
           force: bool = True, tensors: dict | None = None) -> None:
    """The drafter (or `tensors` in its shape) as a validated `dflash` GGUF, with the training record in its
    dflash_gguf.train.* keys."""
    from ..convert.writer import write_dflash_gguf  # noqa: PLC0415
    meta = {f"dflash_gguf.train.{k}": (json.dumps(v) if isinstance(v, (dict, list)) else v)
            for k, v in record.items() if v is not None}
    state = trainer.state_numpy() if tensors is None else tensors
    write_dflash_gguf(state, trainer.config, target, out, outtype=outtype, extra_metadata=meta, force=force,
                      name=drafter_name(target, trainer.config.family), source="trained drafter", draft_vocab=vocab)


def train_drafter(target: TargetFile, out: Path, prompts: list[dict], work_dir: Path, *, taps: list[int],
                  harvest_settings: HarvestSettings, train_settings: TrainSettings, max_tokens: int | None,
                  outtype: str = "q8_0", resume: bool = False, force: bool = False, data_note: str = "",
                  progress: bool = True, draft_vocab: int | None = None, data_dir: Path | None = None,
                  harvest_seconds: float | None = None, init_drafter: Path | None = None,
                  snapshots: tuple[int, ...] = (), on_snapshot=None, chat_template_source: str | None = None) -> dict:
    """Harvest (resuming what `data_dir` holds), train (resuming the checkpoint in `work_dir` if `resume`),
    export. The draft vocabulary, when asked for, is counted on the harvested data before training, and
    the loss is taken over exactly those tokens, as the drafter will propose them. At each of `snapshots`
    (labelled rows) training pauses for on_snapshot(trainer, vocab, validation) — e.g. to export and measure
    the drafter so far — and goes on exactly as if it had not paused."""
    from .dataset import FeatureDataset  # noqa: PLC0415

    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to overwrite it")
    target_sha = target.sha256
    data_dir = data_dir or work_dir / "data"
    print(f"harvesting training data from {target.path.name} into {data_dir}", file=sys.stderr)
    from .harvest_shards import harvest_in_processes  # noqa: PLC0415
    from .parallel_probe import AUTO, best_parallel  # noqa: PLC0415
    before = FeatureDataset(data_dir).n_rows() if (data_dir / "index.jsonl").exists() else 0
    if harvest_settings.n_parallel == AUTO:
        harvest_settings = replace(harvest_settings, n_parallel=best_parallel(target, prompts, harvest_settings))
    writer = harvest_in_processes(target, prompts, data_dir, harvest_settings, harvest_settings.processes,
                                  max_tokens=max_tokens, max_seconds=harvest_seconds,
            meta_extra={"target_sha256": target_sha, "prompts_sha256": prompts_sha256(prompts),
                        "chat_template": chat_template_source})
    data = FeatureDataset(data_dir)
    new = data.n_rows() - before
    if new:
        print(f"harvested {new:,} tokens in {writer.seconds:.0f} s: {new / max(writer.seconds, 1e-9):.0f} tokens/s "
              f"({harvest_settings.processes} process(es) × {harvest_settings.n_parallel} sequences at a time)",
              file=sys.stderr)
    if data.taps != taps:
        raise UserError(f"{data_dir} was harvested for taps {data.taps}, not {taps}; use another --data-dir")
    trainer, vocab = build_trainer(target, data, train_settings, draft_vocab, init_drafter)
    target.release_model()               # training wants its memory; the export's load check loads it again
    ckpt_dir = work_dir / "checkpoint"
    if resume and (ckpt_dir / "ckpt.pt").exists():
        trainer.resume(ckpt_dir)
        print(f"resumed at {trainer.rows_seen:,} of {trainer.total_rows:,} labelled rows", file=sys.stderr)
    if 0 in snapshots and trainer.rows_seen == 0 and on_snapshot is not None:      # where the run starts from
        on_snapshot(trainer, vocab, trainer.evaluate(trainer.s.eval_seqs))
    for stop in sorted(s for s in snapshots if trainer.rows_seen < s < trainer.total_rows):
        val = trainer.train(ckpt_dir, progress=progress, stop_at=stop)
        if on_snapshot is not None:
            on_snapshot(trainer, vocab, val)
    result = trainer.train(ckpt_dir, progress=progress)
    train_ids, val_ids = data.split()
    record = {"target": target.path.name, "target_sha256": target_sha, "taps": taps,
              "train_settings": asdict(train_settings),
              "harvest_settings": asdict(harvest_settings) | {"chat_template": chat_template_source},
              "dataset": data_dir.name, "sequences": len(data.index), "train_sequences": len(train_ids),
              "val_sequences": len(val_ids), "response_tokens": data.n_tokens(train_ids),
              **training_record(trainer, result),
              "init_drafter": getattr(trainer, "init_record", None), "data": data_note}
    before = getattr(trainer, "init_record", None)
    if before:                           # counted from the very first drafter of the chain
        record["labelled_rows_in_all"] = before["labelled_rows_in_all"] + trainer.rows_seen
        record["response_tokens_in_all"] = before["response_tokens_in_all"] + record["response_tokens"]
    if vocab is not None:
        from ..drafter import draft_vocab as dv  # noqa: PLC0415
        counts = np.bincount(data.written_tokens(), minlength=trainer.n_vocab)
        record["draft_vocab"] = {"size": vocab.size, "coverage_of_training_tokens": dv.coverage(vocab.token_ids, counts)}
    export(trainer, target, out, record, vocab, outtype=outtype, force=force)
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "train-record.json").write_text(json.dumps(record, indent=2))
    return record
