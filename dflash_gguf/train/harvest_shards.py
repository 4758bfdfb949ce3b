"""The harvest in several processes side by side (`--harvest-processes N`), each taking every N-th prompt.

On a busy CPU, N single-threaded processes generate more than one N-threaded one: ggml's threads wait for each
other at every op, and a descheduled thread stalls them all (Gemma 3 270M on the shared 2-core machine, 16
sequences a step: 1.05 s a step with one thread, 5.2 s with two). Every process appends to the one dataset
under its file lock (harvest.DatasetWriter), so the data is the same whatever N is, up to the order of sequences.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from ..errors import RunFailure
from ..target_file import TargetFile
from .harvest import HarvestSettings, harvest


def _shard(args) -> None:
    target_path, prompts, out, settings, shard, kwargs = args
    with TargetFile.open(target_path) as target:
        harvest(target, prompts, out, settings, shard=shard, **kwargs)


def harvest_in_processes(target: TargetFile, prompts: list[dict], out: Path, settings: HarvestSettings, processes: int,
                         **kwargs):
    """harvest() over `processes` shards: shard 0 here, the others in spawned processes. Returns shard 0's
    writer; the dataset folder holds every shard's sequences."""
    if processes <= 1:
        return harvest(target, prompts, out, settings, **kwargs)
    spawn = multiprocessing.get_context("spawn")
    others = [spawn.Process(target=_shard, args=((target.path, prompts, out, settings, (i, processes), kwargs),))
              for i in range(1, processes)]
    for p in others:
        p.start()
    try:
        writer = harvest(target, prompts, out, settings, shard=(0, processes), **kwargs)
    finally:
        for p in others:
            p.join()
    failed = [i + 1 for i, p in enumerate(others) if p.exitcode != 0]
    if failed:
        raise RunFailure(f"{out}: harvest shards {failed} of {processes} failed (their error is above); "
                         "run again to resume, or with --harvest-processes 1")
    return writer
