#!/usr/bin/env python3
"""Why does `train --adapt`'s guard miss the fall on ../shared/prompts? Are its sets near-copies of the replay?

The general and everyday sets are held-back rows of the prompt sets the replay is drawn from: the same math templates
with other numbers, functions of the same modules, the same request templates. The replay trains on those directly,
so it may protect exactly what the guard measures. This probe measures the fall of adapted drafters (blends of a
`train --adapt` drafter with the start, as blend_probe.py writes them) on four sets of held-back prompts: those whose
family (math template, code module, request template) the run's replay holds ("seen") and those whose family it
does not ("unseen": self-instruct math questions, modules no replayed sequence came from), next to the current
guard sets. ../shared/prompts is measured beside them for evaluation only; it chooses nothing.

  nice -n 5 lab/guard_probe.py --work <harness work> --domain math-tutor --alphas 0.667,1,1.111 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))

from blend_probe import blend  # noqa: E402
from learn_harness import SHARED, taus  # noqa: E402

from dflash_gguf.assets import shipped_drafter_for  # noqa: E402
from dflash_gguf.corpus.prompts import family  # noqa: E402
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402


def probe_sets(replay_index: Path, per_set: int) -> dict[str, list[dict]]:
    """Held-back prompts (never the shipped drafter's training data, never in a guard set) by category and by
    whether the replay holds their family."""
    from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS, HELD_BACK_FROM, general_set, load
    replayed = {family(json.loads(line)) for line in replay_index.read_text().splitlines() if line.strip()}
    rows = load(DEFAULT_PROMPTS)
    held = [{"id": i, **r} for i, r in enumerate(rows) if i >= HELD_BACK_FROM]
    guard = {r["id"] for r in general_set(rows[HELD_BACK_FROM:], 10)}
    out: dict[str, list[dict]] = {}
    for r in held:
        if r["id"] - HELD_BACK_FROM in guard or r.get("followups"):
            continue
        key = f"{r['category']}-{'seen' if family(r) in replayed else 'unseen'}"
        if len(out.setdefault(key, [])) < per_set:
            out[key].append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="learn_harness --work")
    ap.add_argument("--domain", required=True)
    ap.add_argument("--alphas", default="0.667,1,1.111", help="shares of <domain>/adapt/best.gguf in the blends")
    ap.add_argument("--replay-index", type=Path, help="the run's replay data index.jsonl (default: the user cache's)")
    ap.add_argument("--per-set", type=int, default=15)
    ap.add_argument("--shared", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    work = a.work / a.domain
    start = shipped_drafter_for(smollm2_q4_1())
    alphas = [float(x) for x in a.alphas.split(",")]
    out = work / "guard-probe"
    out.mkdir(exist_ok=True)
    drafters = [start] + [blend(start, work / "adapt" / "best.gguf", x, out / f"blend-{x:g}.gguf") for x in alphas]
    labels = ["start"] + [f"α={x:g}" for x in alphas]
    if a.replay_index is None:
        from dflash_gguf.paths import cache_root
        (a.replay_index,) = sorted((cache_root() / "adapt-replay").glob("*/index.jsonl"))
    sets = probe_sets(a.replay_index, a.per_set)
    from dflash_gguf.bench.prompts import read_rows
    from dflash_gguf.train.adapt import prompt_sets
    _, general, everyday = prompt_sets((), 10, 0)
    sets |= {"general (guard)": general, "everyday (guard)": everyday,
             "shared (evaluation only)": read_rows(sorted(SHARED.glob("*.jsonl")), a.shared)}
    print("| set | prompts | " + " | ".join(labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for name, rows in sets.items():
        tag = name.split(" ")[0]
        measured = taus(drafters, rows, out / f"tau-{tag}-{a.alphas}.json", a)
        base = measured[0]["tau_overall"]
        cells = [f"{base:.3f}"] + [f"{m['tau_overall'] - base:+.3f}" for m in measured[1:]]
        print(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
