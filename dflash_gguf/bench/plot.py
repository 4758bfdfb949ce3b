"""One PNG: speedup per category and baseline, our acceptance by draft slot, the verify-cost curve."""

from __future__ import annotations

import math
from pathlib import Path

SPEEDUP_BASELINES = ("dflash", "lookup", "hybrid", "upstream", "ngram")
LABELS = {"dflash": "ours (DFlash)", "lookup": "ours (lookup)", "hybrid": "ours (hybrid)",
          "upstream": "upstream C++ DFlash", "ngram": "upstream n-gram"}


def plot(report: dict, out: Path) -> Path:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    summary = report["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    _speedups(axes[0], summary)
    _acceptance(axes[1], summary)
    _cost_curve(axes[2], report["cost_curve"]["ratios"])
    missing = report.get("missing") or {}
    title = f"{Path(report['target']).name} + {Path(report['drafter']).name}, -n {report['n_predict']}"
    if missing:
        title += "   (missing: " + ", ".join(missing) + ")"
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _speedups(ax, summary: dict) -> None:
    cats = list(summary)
    present = [b for b in SPEEDUP_BASELINES if any(b in summary[c] for c in cats)]
    width = 0.8 / max(len(present), 1)
    for i, b in enumerate(present):
        med, lo, hi = [], [], []
        for c in cats:
            s = (summary[c].get(b) or {}).get("speedup") or {}
            m = s.get("median")
            med.append(math.nan if m is None else m)          # a missing value draws no bar, never a zero
            lo.append(0 if m is None else m - s["min"])
            hi.append(0 if m is None else s["max"] - m)
        xs = [x + i * width for x in range(len(cats))]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=LABELS[b])
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_xticks([x + width * (len(present) - 1) / 2 for x in range(len(cats))], cats)
    ax.set_ylabel("speedup vs plain decoding (median, min-max)")
    if present:
        ax.legend()


def _acceptance(ax, summary: dict) -> None:
    for c, per in summary.items():
        acc = (per.get("dflash") or {}).get("all_repeats", {}).get("acceptance_per_slot")
        if acc:
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=c)
    ax.set_xlabel("draft slot (ours)")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    if ax.lines:
        ax.legend()


def _cost_curve(ax, ratios: dict) -> None:
    bs = sorted(int(b) for b in ratios)
    ys = [ratios[b] if b in ratios else ratios[str(b)] for b in bs]
    ax.plot(bs, ys, marker="o", label="measured t(B)/t(1)")
    ax.plot(bs, [1] * len(bs), color="gray", lw=1, ls="--", label="free batching")
    ax.set_xlabel("verify batch B (tokens)")
    ax.set_ylabel("t(B) / t(1)")
    ax.legend()
