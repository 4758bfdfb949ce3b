"""What more compute buys: τ against labelled rows trained, fitted as τ = a + b·log10(rows), and the rows
(hence hours at a measured rows/s) that the fit says reach a given τ. An extrapolation, labelled as one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dflash_gguf.train.dataset import FeatureDataset


class SubsetDataset(FeatureDataset):
    """The same folder, training on the given sequences only (validation stays the whole held-out set)."""

    def __init__(self, root: Path, keep):
        self._keep = keep
        super().__init__(root)

    def split(self, every: int = 20) -> tuple[list[int], list[int]]:
        train, val = super().split(every)
        return [i for i in train if self._keep(i, self.index[i])], val


def fit_log_linear(rows: list[float], tau: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares line τ = a + b·log10(rows)."""
    b, a = np.polyfit(np.log10(np.asarray(rows, float)), np.asarray(tau, float), 1)
    return float(a), float(b)


def rows_for_tau(a: float, b: float, tau: float) -> float | None:
    """Rows at which the fitted line reaches τ; None if it never rises."""
    if b <= 1e-9:
        return None
    exponent = (tau - a) / b
    return 10 ** exponent if exponent < 300 else math.inf


def tau_from_alpha(alpha: float, block: int = 8) -> float:
    """τ of a full block when every slot is accepted with probability alpha, independently."""
    return (1 - alpha ** block) / (1 - alpha) if alpha < 1 else float(block)


def alpha_from_tau(tau: float, block: int = 8) -> float:
    lo, hi = 0.0, 1.0 - 1e-9
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau_from_alpha(mid, block) < tau else (lo, mid)
    return (lo + hi) / 2


def measured(tau, val) -> dict:
    """A curve point's measurements: engine τ on held-out prompts (a measure.TauReport) and the last
    validation (walk-counted τ, anchor-averaged τ, loss)."""
    return {"tau": round(tau.overall, 3), "tau_by_category": {k: round(v, 3) for k, v in tau.by_category.items()},
            "slot_accept": [round(x, 3) for x in tau.slot_accept], "val_tau": round(val.tau, 3),
            "val_anchor_tau": round(val.anchor_tau, 3), "val_tau_counted": "walk", "val_loss": round(val.loss, 4)}


def best_compute_series(points: list[dict]) -> str:
    """The compute series (training recipe) whose largest run measured the highest engine τ."""
    largest: dict[str, dict] = {}
    for p in points:
        if p["series"].startswith("compute") and p["rows"] >= largest.get(p["series"], {"rows": -1})["rows"]:
            largest[p["series"]] = p
    return max(largest, key=lambda s: largest[s]["tau"])


def _reach(rows_at, rows_per_s: float, taus) -> dict:
    out = {}
    for t in taus:
        r = rows_at(t)
        out[str(t)] = None if r is None or not math.isfinite(r) else {
            "rows": float(f"{r:.3g}"), "cpu_hours": float(f"{r / rows_per_s / 3600:.3g}")}
    return out


def extrapolate(points: list[dict], rows_per_s: float, taus=(3.0, 4.0, 5.0), block: int = 8) -> dict:
    """From points {rows, tau}, two fits and, per τ, the rows and CPU hours at `rows_per_s` each one predicts:
    τ linear in log10(rows), and the per-slot acceptance α (τ = (1-α^B)/(1-α)) logistic in log10(rows)."""
    rows = [p["rows"] for p in points]
    a, b = fit_log_linear(rows, [p["tau"] for p in points])
    logit = [math.log(x / (1 - x)) for x in (alpha_from_tau(p["tau"], block) for p in points)]
    b2, a2 = np.polyfit(np.log10(np.asarray(rows, float)), np.asarray(logit), 1)

    def rows_logistic(t):
        al = alpha_from_tau(t, block)
        if b2 <= 1e-9:
            return None
        exponent = (math.log(al / (1 - al)) - a2) / b2
        return 10 ** exponent if exponent < 300 else math.inf

    return {"fit": {"a": round(a, 4), "b_per_decade": round(b, 4)},
            "fit_acceptance": {"logit_alpha_at_1_row": round(float(a2), 4), "logit_per_decade": round(float(b2), 4)},
            "rows_per_s": round(rows_per_s, 1),
            "reach": _reach(lambda t: rows_for_tau(a, b, t), rows_per_s, taus),
            "reach_acceptance_model": _reach(rows_logistic, rows_per_s, taus)}


def val_counted(point: dict) -> str:
    """How a point's validation τ was counted: 'walk' (as the engine counts, since 2026-11-24) or
    'anchor average' (every anchor weighted alike: higher than the engine's count on the same drafts)."""
    return point.get("val_tau_counted", "anchor average")


def plot_curve(report: dict, out: Path) -> Path:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    fitted = report["extrapolation"].get("series", "compute")
    series = sorted({p["series"] for p in report["points"] if p["series"].startswith("compute")})
    for n, name in enumerate(series):
        pts = sorted((p for p in report["points"] if p["series"] == name), key=lambda p: p["rows"])
        xs = [p["rows"] for p in pts]
        ax.plot(xs, [p["tau"] for p in pts], "o-", color=f"C{n}", label=f"engine τ: {name}")
        for counted, style in (("walk", "s--"), ("anchor average", "x:")):
            val = [(p["rows"], p["val_tau"]) for p in pts if val_counted(p) == counted]
            if val:
                ax.plot(*zip(*val), style, color=f"C{n}", alpha=0.5, label=f"validation τ ({counted}): {name}")
        if name == fitted:
            for cat, marker in (("code", "^"), ("math", "v"), ("chat", "d")):
                ax.plot(xs, [p["tau_by_category"].get(cat, math.nan) for p in pts], marker, color=f"C{n}", alpha=0.4,
                        label=f"engine τ {cat}: {name}")
    pts = [p for p in report["points"] if p["series"] == fitted]
    xs = [p["rows"] for p in pts]
    fit = report["extrapolation"]["fit"]
    grid = np.logspace(math.log10(min(xs)), math.log10(max(xs)) + 1.5, 50)
    ax.plot(grid, fit["a"] + fit["b_per_decade"] * np.log10(grid), ":", color="gray", label="fit (extrapolated)")
    ax.set_xscale("log")
    ax.set_xlabel("labelled rows trained")
    ax.set_ylabel("τ (tokens per target call, block 8)")
    ax.set_title("τ vs training compute")
    ax.legend(fontsize=6)
    ax = axes[1]
    others = [p for p in report["points"] if not p["series"].startswith("compute")]
    names = [f"{p['series']}\n{p['label']}" for p in others]
    ax.bar(range(len(others)), [p["tau"] for p in others], label="engine τ")
    ax.plot(range(len(others)), [p["val_tau"] for p in others], "s", color="C1", label="validation τ")
    ax.set_xticks(range(len(others)), names, fontsize=7, rotation=20, ha="right")
    if others:
        ax.set_ylim(1.0, max(max(p["tau"], p["val_tau"]) for p in others) + 0.05)
    ax.set_ylabel("τ")
    ax.set_title("same compute: data size and prompt diversity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
