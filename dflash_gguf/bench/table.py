"""The bench report as plain-text tables (what the terminal shows; the JSON has everything)."""

from __future__ import annotations

from .report import SPLIT

NAMES = {"plain": "plain", "dflash": "dflash", "lookup": "lookup", "hybrid": "hybrid", "upstream": "upstream",
         "ngram": "n-gram"}


def _num(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _spread(s: dict | None, nd=2) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s["min"] == s["max"]:
        return _num(s["median"], nd)
    return f"{_num(s['median'], nd)} [{_num(s['min'], nd)}-{_num(s['max'], nd)}]"


def render(report: dict) -> str:
    lines = [f"target {report['target']}", f"drafter {report['drafter']} ({report.get('drafter_member', 'DFlash')})",
             f"{report['prompts']} prompts {report['per_category']}, -n {report['n_predict']}, "
             f"repeat {report['repeat']}, threads {report['threads']}, -ngl {report['n_gpu_layers']}, "
             f"draft-max {report['draft_max']}{' adaptive' if report['adaptive'] else ''}"
             + (f", lookup-max {report['lookup_max']}" if report.get("lookup_max") else ""),
             "load average (1 min) before/after: {:.1f} / {:.1f}".format(report["load_average"]["before"][0],
                                                                        report["load_average"]["after"][0]), ""]
    head = f"{'category':<9} {'baseline':<9} {'tok/s':>20} {'speedup':>18} {'tau':>6} {'accept':>6} " \
           f"{'limit':>6} {'eff':>6} {'same':>6}"
    lines.append(head)
    for cat, per in report["summary"].items():
        for b, e in per.items():
            pooled = e["all_repeats"]
            lines.append(f"{cat:<9} {NAMES[b]:<9} {_spread(e['tok_s'], 1):>20} {_spread(e.get('speedup')):>18} "
                         f"{_num(e['tau']['median']):>6} {_num(pooled.get('acceptance')):>6} "
                         f"{_num((e.get('limit') or {}).get('median')):>6} "
                         f"{_num((e.get('efficiency') or {}).get('median')):>6} "
                         f"{pooled.get('identical_to_plain', '-'):>6}")
    lines.append("")
    overall = report["summary"].get("all", {})
    acc = (overall.get("dflash") or {}).get("all_repeats", {}).get("acceptance_per_slot")
    if acc:
        lines.append("dflash, acceptance per slot (all): " + " ".join(f"{x:.2f}" for x in acc))
    for b in ("lookup", "hybrid"):
        pooled = (overall.get(b) or {}).get("all_repeats")
        if pooled and pooled["n_drafted"]:
            lines.append(f"{b}: {pooled['n_lookup_drafted']} of {pooled['n_drafted']} drafts from the lookup, "
                         f"{pooled['n_lookup_accepted']} of them accepted")
    for b in ("plain", "dflash", "lookup", "hybrid"):
        split = (overall.get(b) or {}).get("time_split")
        if split:
            lines.append(f"where the time goes, {NAMES[b]} (ms per target call, share of decode): " + ", ".join(
                f"{k} {split[k]['ms_per_call']:.2f} ({100 * split[k]['share']:.0f}%)" for k in SPLIT))
    lim = (overall.get("dflash") or {}).get("limit_measured")
    if lim and lim.get("median") is not None:
        lines.append(f"dflash, limit from this run's verify+draft times {_num(lim['median'])}, efficiency "
                     f"{_num(overall['dflash']['efficiency_measured']['median'])}")
    lines.append(cost_curve_line(report["cost_curve"]))
    for b, why in report["missing"].items():
        lines.append(f"missing baseline {b}: {why}")
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)


def cost_curve_line(cc: dict) -> str:
    """One line: the verify cost t(B)/t(1) per B (with --repeat: the median curve's, each B's range over the
    curves in brackets), t(1) and the draft call's cost."""
    spread = cc.get("ratio_range") or {}
    return ("verify cost t(B)/t(1): " + " ".join(f"B{b}={r:.2f}" + (f" [{spread[b][0]:.2f}-{spread[b][1]:.2f}]"
                                                                    if b in spread and b != 1 else "")
                                                 for b, r in cc["ratios"].items())
            + f"; t(1) {1000 * cc['t_s'][1]:.2f} ms"
            + (f", draft {1000 * cc['t_draft_s']:.2f} ms" if cc["t_draft_s"] else "")
            + (f" (short blocks: {1000 * cc['t_draft_n_s'][min(cc['t_draft_n_s'])]:.2f} ms for "
               f"{min(cc['t_draft_n_s'])} token)" if cc.get("t_draft_n_s") else ""))


def tau_line(report: dict) -> str:
    """One line: τ per category and overall, and what it was measured on."""
    per_cat = " · ".join(f"{c} {t:.3f}" for c, t in report["tau"].items())
    return (f"τ {per_cat} · overall {report['tau_overall']:.3f} ({sum(report['prompts'].values())} prompts, "
            f"up to {report['n_predict']} tokens each, full blocks of {len(report['slot_accept']) + 1})")
