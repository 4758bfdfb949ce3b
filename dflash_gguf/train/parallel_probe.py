"""`train --parallel auto`: the harvest's throughput at a few widths, timed on the run's own prompts before it
starts, and the fastest width kept. How many sequences to generate together depends on the target, the machine
and its load (SmolLM2 on the 2-core EPYC peaks at 16-32; Gemma 3 270M, whose output head is most of its work,
lower), so a short measurement beats a fixed guess."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from .harvest import HarvestSettings, harvest

AUTO = 0                      # HarvestSettings.n_parallel that asks for the probe
WIDTHS = (4, 8, 16, 32)
SECONDS_PER_WIDTH = 15.0


def best_parallel(target, prompts: list[dict], settings: HarvestSettings, widths=WIDTHS,
                  seconds: float = SECONDS_PER_WIDTH) -> int:
    """The width of the highest response tokens/s, each harvested for `seconds` into a scratch folder."""
    rates = {}
    for width in widths:
        with tempfile.TemporaryDirectory(prefix="dflash-gguf-parallel-") as scratch:
            writer = harvest(target, prompts, Path(scratch), replace(settings, n_parallel=width), max_seconds=seconds)
        rates[width] = writer.n_response_written / max(writer.seconds, 1e-9)
        print(f"--parallel auto: {width} sequences at a time, {rates[width]:.0f} tokens/s", file=sys.stderr)
    best = max(rates, key=rates.get)
    print(f"--parallel auto: harvesting {best} sequences at a time", file=sys.stderr)
    return best
