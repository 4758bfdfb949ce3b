"""The GPU check's results as the Markdown tables that go into README (bench, verify curves, MoE offload)."""

from __future__ import annotations


def _f(x, fmt="{:.2f}", none="–") -> str:
    return none if x is None else fmt.format(x)


def _speed(e: dict | None) -> str:
    s = (e or {}).get("speedup") or {}
    if s.get("median") is None:
        return "–"
    spread = f" [{s['min']:.2f}–{s['max']:.2f}]" if s["min"] != s["max"] else ""
    return f"{s['median']:.2f}×{spread}"


def _device(results: dict) -> str:
    build = (results.get("steps", {}).get("build") or {}).get("details") or {}
    gpus = build.get("gpus") or []
    return ", ".join(f"{g['name']} ({g['description']})" for g in gpus) or "CPU only"


def bench_table(d: dict) -> list[str]:
    per = d["summary"].get("all", {})
    plain, ours, up, ng = (per.get(b) for b in ("plain", "dflash", "upstream", "ngram"))
    tau = f"{_f(((ours or {}).get('tau') or {}).get('median'))} / {_f(((up or {}).get('tau') or {}).get('median'))}"
    cats = ", ".join(f"{n} {c}" for c, n in (d.get("per_category") or {}).items())
    return [f"Bench: `dflash-gguf bench -ngl {d['n_gpu_layers']}`, {d['target'].rsplit('/', 1)[-1]} + "
            f"{d['drafter'].rsplit('/', 1)[-1]}, {cats} prompts, {d['n_predict']} tokens, greedy, "
            f"--repeat {d['repeat']} (medians):", "",
            "| plain tok/s | ours | upstream C++ DFlash | n-gram | τ ours / upstream | ours = plain |",
            "|---|---|---|---|---|---|",
            f"| {_f(((plain or {}).get('tok_s') or {}).get('median'), '{:.1f}')} | {_speed(ours)} | {_speed(up)} | "
            f"{_speed(ng)} | {tau} | {(ours or {}).get('identical_to_plain') or '–'} |"]


def curve_table(rows: list[tuple[str, dict]]) -> list[str]:
    bs = sorted({int(b) for _, d in rows for b in d["ratios"]} - {1})     # t(1) itself is its own column
    out = ["Verify cost t(B)/t(1) (B tokens in one decode with logits on every row, after 256 tokens of "
           "context, every layer on the device):", "",
           "| model | t(1) ms | " + " | ".join(f"B={b}" for b in bs) + " |", "|---|---|" + "---|" * len(bs)]
    for name, d in rows:
        out.append(f"| {name} | {d['t1_ms']:.2f} | " + " | ".join(_f(d["ratios"].get(str(b)) or d["ratios"].get(b))
                                                                 for b in bs) + " |")
    return out


def moe_table(d: dict) -> list[str]:
    gen = (d.get("generated") or {}).get("spec", {})
    out = [f"MoE offload (random-weight {gen.get('shape', '?')} {gen.get('ftype', '')}, plain decoding, "
           f"{d['n_predict']} tokens, median of {d['repeat']}):", "",
           "| placement | flags | tok/s | vs all on the GPU | ours (random drafter) vs plain |",
           "|---|---|---|---|---|"]
    for name, r in d["placements"].items():
        fit = f" ({r['fit'][0]})" if r.get("fit") else ""
        ours = r.get("ours") or {}
        out.append(f"| {name} | `{r['flags']}`{fit} | {r['tok_s']:.1f} | {_f(r.get('vs_all_gpu'))} | "
                   f"{_f(ours.get('vs_plain'))} |")
    return out


def render_table(results: dict) -> str:
    steps = results.get("steps", {})
    inv = (results.get("invocations") or [{}])[-1]

    def details(name: str) -> dict | None:
        s = steps.get(name) or {}
        return s.get("details") if s.get("status") == "passed" else None

    parts = [f"GPU check, {inv.get('started', '?')[:10]}, {_device(results)}, backend {inv.get('backend')}, "
             f"profile {inv.get('profile')}: " + ", ".join(f"{k} {v}" for k, v in results.get("summary", {}).items())]
    if details("bench"):
        parts.append("\n".join(bench_table(details("bench"))))
    curves = [("SmolLM2-135M Q4_1", details("verify"))]
    if details("verify8b"):
        spec = (details("verify8b").get("generated") or {}).get("spec", {})
        label = f"{spec.get('shape', '?')} random-weight {spec.get('ftype', '')}"
        curves.append((f"{label}, ours (bench --cost-curve-only)", details("verify8b")))
        if details("verify8b").get("stock"):
            curves.append((f"{label}, stock (llama-bench pp B)", details("verify8b")["stock"]))
    curves = [(label, d) for label, d in curves if d]
    if curves:
        parts.append("\n".join(curve_table(curves)))
    if details("moe"):
        parts.append("\n".join(moe_table(details("moe"))))
    greedy = results.get("greedy_equals_plain") or {}
    if greedy.get("answer") is not None:
        bad = [n for n, st in greedy["tests"].items() if st != "passed"]
        parts.append(f"Greedy output on the device equals plain decoding: {'yes' if greedy['answer'] else 'NO'} "
                     f"({len(greedy['tests']) - len(bad)}/{len(greedy['tests'])} device tests"
                     + (f"; not passed: {', '.join(bad)}" if bad else "")
                     + (f"; bench identical to plain: {greedy['bench_identical_to_plain']}"
                        if greedy["bench_identical_to_plain"] else "") + ")")
    return "\n\n".join(parts)
