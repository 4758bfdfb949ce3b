#!/usr/bin/env python3
"""Does a blend of the adapted drafter with the one it started from keep the persona's gain and lose less elsewhere?

Weight-space interpolation between a fine-tuned model and its start (WiSE-FT, Wortsman et al. 2022) often keeps
most of the fine-tune's in-domain gain while giving back most of what it forgot. This probe writes
  blend(α) = (1 - α) · start + α · adapted        (every tensor, dequantised, requantised to Q8_0)
for each α, and measures τ (bench --tau's measurement, all drafters along the same greedy continuations) on a
learn_harness domain's unseen test prompts and on ../shared/prompts, as the harness does.

  nice -n 19 lab/blend_probe.py --work <harness work> --domain math-tutor --alphas 0.4,0.6,0.8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))

from learn_harness import SHARED, domain_rows, taus  # noqa: E402

from dflash_gguf.assets import shipped_drafter_for  # noqa: E402
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402


def blend(start: Path, adapted: Path, alpha: float, out: Path) -> Path:
    """(1 - alpha) * start + alpha * adapted, tensor by tensor, as a validated Q8_0 drafter at `out`."""
    from dflash_gguf.convert.checkpoint_formats import read_source
    from dflash_gguf.convert.writer import write_dflash_gguf
    from dflash_gguf.target_file import TargetFile
    from dflash_gguf.train.adapt import blended
    target = TargetFile(smollm2_q4_1())
    a, b = read_source(str(start), target), read_source(str(adapted), target)
    if set(a.tensors) != set(b.tensors):
        raise SystemExit(f"{start} and {adapted} hold different tensors")
    write_dflash_gguf(blended(a.tensors, b.tensors, alpha), b.config, target, out, outtype="q8_0", force=True,
                      name=f"blend {alpha:g}", source="blended drafter", draft_vocab=b.draft_vocab,
                      extra_metadata={"dflash_gguf.train.blend": float(alpha)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="learn_harness --work (its <domain>/adapt/best.gguf)")
    ap.add_argument("--domain", required=True)
    ap.add_argument("--adapted", type=Path, help="default: <work>/<domain>/adapt/best.gguf")
    ap.add_argument("--alphas", default="0.4,0.6,0.8")
    ap.add_argument("--conversations", type=int, default=300)
    ap.add_argument("--test", type=int, default=50)
    ap.add_argument("--shared", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    work = a.work / a.domain
    adapted = a.adapted or work / "adapt" / "best.gguf"
    start = shipped_drafter_for(smollm2_q4_1())
    alphas = [float(x) for x in a.alphas.split(",")]
    out = work / "blend"
    out.mkdir(exist_ok=True)
    drafters = [start] + [blend(start, adapted, x, out / f"blend-{x:g}.gguf") for x in alphas] + [adapted]
    labels = ["start"] + [f"α={x:g}" for x in alphas] + ["adapted"]
    from dflash_gguf.bench.prompts import read_rows
    rows = domain_rows(a.domain)
    tag = "-".join(f"{x:g}" for x in alphas)
    dom = taus(drafters, rows[a.conversations:a.conversations + a.test], out / f"tau-domain-{tag}.json", a)
    shared = taus(drafters, read_rows(sorted(SHARED.glob("*.jsonl")), a.shared), out / f"tau-shared-{tag}.json", a)
    print("| drafter | τ unseen domain | Δ | τ ../shared/prompts | Δ | by category |")
    print("|---|---|---|---|---|---|")
    for label, d, s in zip(labels, dom, shared):
        cats = ", ".join(f"{c} {v:.2f}" for c, v in sorted(s["tau"].items()))
        print(f"| {label} | {d['tau_overall']:.3f} | {d['tau_overall'] - dom[0]['tau_overall']:+.3f} | "
              f"{s['tau_overall']:.3f} | {s['tau_overall'] - shared[0]['tau_overall']:+.3f} | {cats} |")
    (out / f"result-{tag}.json").write_text(json.dumps({"labels": labels, "domain": dom, "shared": shared}, indent=1))


if __name__ == "__main__":
    main()
