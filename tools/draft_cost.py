#!/usr/bin/env python3
"""What a draft call costs against the target's decodes, for several drafters of one target, side by side.

Every drafter is loaded into one process and calibrated in turn (`Engine.measure_cost_curve`: target decodes of B
rows and draft calls after a fixed context), `--rounds` times, so a slow spell of a shared machine hits each alike.
Prints one JSON line per drafter: medians of the full-block draft, the one-token decode t(1) and the verify of
block-size rows, and their ratios.

    .venv/bin/python tools/draft_cost.py a.gguf b.gguf --threads 1
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash_gguf.engine.session import Engine  # noqa: E402
from dflash_gguf.settings import EngineSettings  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("drafters", type=Path, nargs="+")
ap.add_argument("--target", type=Path, default=None, help="default: the embedded default target")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--dspark-chain", choices=["engine", "graph", "both"], default="engine",
                help="DSpark drafters: time the Markov chain where the engine runs it (numpy on the CPU), in "
                     "llama.cpp's graph, or both side by side")
a = ap.parse_args()


def opened(path: Path, in_graph: bool | None) -> Engine:
    engine = Engine(EngineSettings(target=a.target, drafter=path, n_threads=a.threads, adaptive=False))
    if in_graph is not None and hasattr(engine.drafter, "place_chain"):
        engine.drafter.place_chain(in_graph)
    return engine


places = {"engine": [(None, "")], "graph": [(True, " [chain in graph]")],
          "both": [(None, ""), (True, " [chain in graph]")]}[a.dspark_chain]
engines = {f"{p}{label}": opened(p, where) for p in a.drafters for where, label in places}
curves = {p: [] for p in engines}
for _ in range(a.rounds):
    for p, engine in engines.items():
        curves[p].append(engine.measure_cost_curve())
for p, cs in curves.items():
    block = engines[p].draft_max + 1
    draft = statistics.median(c.t_draft for c in cs)
    t1 = statistics.median(c.t[1] for c in cs)
    tb = statistics.median(c.verify(block) for c in cs)
    print(json.dumps({"drafter": str(p), "draft_ms": round(draft * 1e3, 2), "t1_ms": round(t1 * 1e3, 2),
                      f"t{block}_ms": round(tb * 1e3, 2), "draft_over_t1": round(draft / t1, 3),
                      f"draft_over_t{block}": round(draft / tb, 3)}))
