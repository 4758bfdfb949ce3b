#!/usr/bin/env python3
"""MoE expert placement through the CLI: plain-decoding tok/s with every layer on the GPU, with the experts
of the first N layers on the CPU (--n-cpu-moe), all experts on the CPU (--cpu-moe), and what --fit picks.

Each placement is one `dflash-gguf run --plain --json` process (so each loads the model as a user would),
repeated --repeat times; the median tok/s and the ratio to all-on-GPU are printed as one JSON object.
With --ours, the placements that keep experts on the CPU also run speculatively (the default adaptive policy)
with a random-weight drafter made for the model (tests/helpers/engine.write_random_drafter: it drafts badly, the
worst case for speculation), and `ours_vs_plain` says whether ours ever fell below plain decoding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

PROMPT = "The history of the printing press begins long before Gutenberg. Craftsmen in many lands carved"


def placements(n_layer: int) -> dict[str, list[str]]:
    return {"all_gpu": ["-ngl", "99"], "n_cpu_moe": ["-ngl", "99", "--n-cpu-moe", str(max(n_layer // 2, 1))],
            "cpu_moe": ["-ngl", "99", "--cpu-moe"], "fit": ["--fit"]}


def run_once(model: Path, flags: list[str], n_predict: int, threads: int, drafter: Path | None = None) -> dict:
    how = ["-md", str(drafter)] if drafter else ["--plain"]
    cmd = [sys.executable, "-m", "dflash_gguf.cli", "run", "-m", str(model), *how, "--json", "-p", PROMPT,
           "-n", str(n_predict), "-t", str(threads), "-c", "1024", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    fit = [line.strip() for line in proc.stderr.splitlines() if line.startswith("fit:")]
    return {"tok_s": out["stats"]["tok_s"], "tokens": out["tokens"], "fit": fit, "tau": out["stats"].get("tau")}


def random_drafter(model: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tests"))
    from helpers.engine import write_random_drafter  # noqa: PLC0415 (a test helper: the GGUF writer of a drafter)
    out = model.with_name(model.stem + "-random-drafter.gguf")
    if not out.is_file():
        n = n_layers(model)
        write_random_drafter(model, out, taps=sorted({1, n // 2, n - 2}), block_size=8, n_head=4, n_head_kv=2)
    return out


def n_layers(model: Path) -> int:
    import gguf
    r = gguf.GGUFReader(str(model))
    return int(r.fields[f"{r.fields['general.architecture'].contents()}.block_count"].contents())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ours", action="store_true", help="also run speculatively where experts are on the CPU")
    a = ap.parse_args(argv)
    drafter = random_drafter(a.model) if a.ours else None
    rows: dict[str, dict] = {}
    for name, flags in placements(n_layers(a.model)).items():
        runs = [run_once(a.model, flags, a.n_predict, a.threads) for _ in range(a.repeat)]
        rows[name] = {"flags": " ".join(flags), "tok_s": statistics.median(r["tok_s"] for r in runs),
                      "tok_s_runs": [r["tok_s"] for r in runs], "fit": runs[0]["fit"], "tokens": runs[0]["tokens"]}
    plain_tokens = {name: r["tokens"] for name, r in rows.items()}
    base_tok_s, base_tokens = rows["all_gpu"]["tok_s"], rows["all_gpu"]["tokens"]
    for r in rows.values():   # greedy: another placement may round differently, so this is reported, not required
        r["vs_all_gpu"] = round(r["tok_s"] / base_tok_s, 3) if base_tok_s else None
        r["same_tokens_as_all_gpu"] = r.pop("tokens") == base_tokens
    for name in ("n_cpu_moe", "cpu_moe") if drafter else ():
        runs = [run_once(a.model, placements(n_layers(a.model))[name], a.n_predict, a.threads, drafter)
                for _ in range(a.repeat)]
        ours = statistics.median(r["tok_s"] for r in runs)
        rows[name]["ours"] = {"tok_s": ours, "tok_s_runs": [r["tok_s"] for r in runs], "tau": runs[0]["tau"],
                              "vs_plain": round(ours / rows[name]["tok_s"], 3) if rows[name]["tok_s"] else None,
                              "same_tokens_as_plain": runs[0]["tokens"] == plain_tokens[name]}
    ours = [r["ours"]["vs_plain"] for r in rows.values() if "ours" in r]
    print(json.dumps({"model": str(a.model), "n_predict": a.n_predict, "threads": a.threads, "repeat": a.repeat,
                      "placements": rows, "ours_vs_plain": {"min": min(ours) if ours else None,
                                                            "drafter": str(drafter) if drafter else None}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
