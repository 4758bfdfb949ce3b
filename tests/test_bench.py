"""bench: runs in seconds on a tiny model, writes well-formed JSON and a PNG, every ratio follows from
the measured times in the JSON, and a baseline that cannot run is reported missing (never as zero)."""

import json
import os
import stat

import numpy as np
import pytest
from typer.testing import CliRunner

from dflash_gguf.bench import upstream
from dflash_gguf.cli import app
from dflash_gguf.errors import UserError
from helpers.engine import write_random_drafter, write_tiny_llama

FAKE_LOG = """llama_model_loader: loaded meta data
main: encoded   {n_prompt} tokens in    0.010 seconds, speed:  300.000 t/s
main: decoded   {n_dec} tokens in    {sec} seconds, speed:  20.000 t/s
main:
main: n_draft   = 3
main: n_predict = {n_dec}
main: n_drafted = 30
main: n_accept  = 12
main: accept    = 40.000%
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    target = write_tiny_llama(d / "tiny.gguf", text=True, n_layer=3)
    drafter = write_random_drafter(target, d / "draft.gguf", taps=[1, 2], block_size=8, n_head=4, n_head_kv=2,
                                   head_dim=16, n_ff=64)
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": c, "prompt": f"t{i + 3} t{i + 5} t{i + 7}"}) + "\n"
                               for i, c in enumerate(["code", "chat", "code", "math"])))
    return target, drafter, prompts, d


def _bench(files, *extra, threads=2):
    target, drafter, prompts, d = files
    r = CliRunner().invoke(app, ["bench", "-m", str(target), "-md", str(drafter), "--prompts", str(prompts),
                                 "-n", "24", "-t", str(threads), *extra])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r


def _rate(rep, baseline, cat, k):
    rs = [x for x in rep["runs"] if x["baseline"] == baseline and x["repeat"] == k and cat in ("all", x["category"])]
    return sum(x["n_decoded"] for x in rs) / sum(x["decode_s"] for x in rs), rs


def test_bench_json_png_and_arithmetic(files):
    d = files[3]
    empty = d / "no-tools"
    empty.mkdir(exist_ok=True)
    out, png = d / "bench.json", d / "bench.png"
    _bench(files, "--repeat", "2", "--no-adaptive", "--draft-max", "3", "--tools-dir", str(empty),
           "--json", str(out), "--plot", str(png))
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rep = json.loads(out.read_text())
    # missing baselines are reported as missing, with the reason, and have no numbers anywhere
    assert set(rep["missing"]) == {"upstream", "ngram"} and "not built" in rep["missing"]["upstream"]
    ours = {"plain", "dflash", "lookup", "hybrid"}
    assert {r["baseline"] for r in rep["runs"]} == ours
    assert all(set(per) == ours for per in rep["summary"].values())
    assert set(rep["summary"]) == {"code", "chat", "math", "all"}
    assert len(rep["runs"]) == 4 * 4 * 2 and all(r["n_decoded"] == 23 or r["finish_reason"] == "stop"
                                                 for r in rep["runs"])
    # greedy is lossless on an F32 target, with every draft source
    assert all(r["matches_plain"] for r in rep["runs"] if r["baseline"] != "plain")
    assert sum(r["n_lookup_drafted"] for r in rep["runs"] if r["baseline"] == "lookup") > 0
    t = {int(b): v for b, v in rep["cost_curve"]["t_s"].items()}
    t_draft = rep["cost_curve"]["t_draft_s"]
    assert rep["cost_curve"]["ratios"]["1"] == 1.0 and set(t) >= {1, 2, 4}
    for cat, per in rep["summary"].items():
        speedups, taus, limits, mlimits = [], [], [], []
        for k in range(2):
            ours, runs = _rate(rep, "dflash", cat, k)
            plain, plain_runs = _rate(rep, "plain", cat, k)
            speedups.append(ours / plain)
            calls = sum(x["n_target_calls"] for x in runs)
            tau = sum(x["n_decoded"] for x in runs) / calls
            taus.append(tau)
            assert all(x["n_drafted"] <= 3 * x["n_target_calls"] for x in runs)      # --draft-max 3 respected
            # the limit from the cost curve: every call costs t(drafted + 1) (+ one draft when it drafted)
            drafted = np.sum([x["drafted_per_slot"] for x in runs], axis=0)
            n_calls_b = {1: calls - drafted[0], 2: drafted[0] - drafted[1], 3: drafted[1] - drafted[2],
                         4: drafted[2]}
            step = sum(c * (np.interp(b, sorted(t), [t[j] for j in sorted(t)]) + (t_draft if b > 1 else 0))
                       for b, c in n_calls_b.items()) / calls
            limits.append(tau * t[1] / step)
            per_call = sum(x["verify_s"] + x["draft_s"] for x in runs) / calls
            mlimits.append(tau * (1 / plain) / per_call)
        s = per["dflash"]
        for key, values in (("speedup", speedups), ("tau", taus), ("limit", limits), ("limit_measured", mlimits)):
            assert np.allclose([s[key]["min"], s[key]["median"], s[key]["max"]],
                               [min(values), np.median(values), max(values)], rtol=1e-9), key
        eff = [a / b for a, b in zip(speedups, limits)]
        assert np.isclose(s["efficiency"]["median"], np.median(eff), rtol=1e-9)
        split = s["time_split"]
        assert np.isclose(sum(v["share"] for v in split.values()), 1.0, atol=1e-6)   # python = the rest


def test_cost_curve_only(files):
    """`--cost-curve-only`: the verify cost t(B)/t(1) and the draft cost, no arm run, one line on the terminal."""
    target, drafter, _, d = files
    out = d / "curve.json"
    r = CliRunner().invoke(app, ["bench", "-m", str(target), "-md", str(drafter), "--cost-curve-only", "-t", "2",
                                 "--draft-max", "3", "--json", str(out)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    rep = json.loads(out.read_text())
    assert "runs" not in rep and "summary" not in rep and rep["drafter"] == str(drafter)
    cc = rep["cost_curve"]
    t = {int(b): v for b, v in cc["t_s"].items()}
    # the sizes a lookup continuation may take (--lookup-max, default 32) are timed too
    assert set(t) >= {1, 2, 4, 32} and max(t) == max(rep["draft_max"], rep["lookup_max"]) + 1 == 33
    assert cc["t_draft_s"] > 0
    assert all(np.isclose(cc["ratios"][str(b)], t[b] / t[1], rtol=1e-12) for b in t)
    assert "verify cost t(B)/t(1): B1=1.00 " in r.output


def test_cost_curve_only_repeated_gives_each_ratios_median_and_range(files):
    """`--cost-curve-only --repeat 3`: three curves, each B's ratio the median of the three curves' own t(B)/t(1)
    and its range, the times the medians of the times; the line shows the ranges."""
    target, _, _, d = files
    out = d / "curves.json"
    r = CliRunner().invoke(app, ["bench", "-m", str(target), "--draft-source", "lookup", "--cost-curve-only", "-t", "2",
                                 "--draft-max", "3", "--lookup-max", "2", "--repeat", "3", "--json", str(out)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    cc = json.loads(out.read_text())["cost_curve"]
    rounds = [{int(b): v for b, v in c["t"].items()} for c in cc["rounds"]]
    assert len(rounds) == 3 and all(sorted(t) == [1, 2, 3, 4] for t in rounds)
    for b in (1, 2, 3, 4):
        own = sorted(t[b] / t[1] for t in rounds)
        assert cc["ratios"][str(b)] == pytest.approx(own[1], rel=1e-12)
        assert cc["ratio_range"][str(b)] == pytest.approx([own[0], own[2]], rel=1e-12)
        assert cc["t_s"][str(b)] == pytest.approx(sorted(t[b] for t in rounds)[1], rel=1e-12)
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("verify cost t(B)/t(1): B1=1.00 B2=") and f"[{own[0]:.2f}-{own[2]:.2f}]" in line


def test_cost_curve_only_without_a_drafter(files):
    """The lookup source with no -md: the target's verify curve alone (what the GPU check times on random models)."""
    target, _, _, d = files
    out = d / "verify-only.json"
    r = CliRunner().invoke(app, ["bench", "-m", str(target), "--draft-source", "lookup", "--cost-curve-only", "-t", "2",
                                 "--draft-max", "3", "--lookup-max", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    rep = json.loads(out.read_text())
    assert rep["drafter"] is None and rep["drafter_member"] is None
    assert sorted(int(b) for b in rep["cost_curve"]["t_s"]) == [1, 2, 3, 4] and not rep["cost_curve"]["t_draft_s"]
    assert "verify cost t(B)/t(1): B1=1.00 " in r.output and "draft" not in r.output.split("t(1)")[-1]


def test_tau_per_category_pools_its_prompts(files):
    """`--tau`: τ per category is the pooled (tokens after the first) / (target calls) of its prompts, within
    [1, block], and no arm runs."""
    target, drafter, prompts, d = files
    out = d / "tau.json"
    raw = d / "raw.jsonl"     # the tiny target has no chat template: every prompt as a completion
    raw.write_text("".join(json.dumps(json.loads(line) | {"format": "completion"}) + "\n"
                           for line in prompts.read_text().splitlines()))
    r = CliRunner().invoke(app, ["bench", "-m", str(target), "-md", str(drafter), "--tau", "--prompts", str(raw),
                                 "-n", "24", "-t", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    rep = json.loads(out.read_text())
    assert "runs" not in rep and rep["prompts"] == {"code": 2, "chat": 1, "math": 1}
    for cat, tau in rep["tau"].items():
        mine = [p for p in rep["per_prompt"] if p["category"] == cat]
        assert tau == round(sum(p["tokens"] - 1 for p in mine) / sum(p["calls"] for p in mine), 3)
        assert 1.0 <= tau <= 8.0
    assert len(rep["slot_accept"]) == 7 and all(0.0 <= a <= 1.0 for a in rep["slot_accept"])
    assert r.output.strip().splitlines()[-1].startswith("τ code 1.000 · chat ")


@pytest.mark.parametrize("extra, message", [(["--cost-curve-only"], "choose one"),
                                            (["--draft-source", "lookup"], "measures a drafter")])
def test_tau_refusals(files, extra, message):
    target, _, prompts, _ = files
    r = CliRunner().invoke(app, ["bench", "-m", str(target), "--tau", "--prompts", str(prompts), *extra])
    assert isinstance(r.exception, UserError) and message in str(r.exception), r.output


def _fake_tool(folder, body: str):
    folder.mkdir(exist_ok=True)
    exe = folder / upstream.TOOL
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.mark.skipif(os.name != "posix", reason="fake tool is a shell script")
def test_upstream_parsed_and_crash_is_missing(files):
    target, drafter, _, d = files
    log = d / "argv.txt"
    # ngram works and prints fixed counters; the DFlash path crashes
    tools = _fake_tool(d / "fake-tools", f"""echo "$@" >> {log}
case "$*" in *draft-dflash*) echo "error: unknown model architecture" >&2; exit 3;; esac
cat >&2 <<'EOF'
{FAKE_LOG.format(n_prompt=3, n_dec=40, sec="2.000")}EOF
""")
    out = d / "fake.json"
    _bench(files, "--baselines", "dflash,upstream,ngram", "--tools-dir", str(tools), "--json", str(out))
    rep = json.loads(out.read_text())
    assert "exit 3" in rep["missing"]["upstream"] and "unknown model architecture" in rep["missing"]["upstream"]
    assert "ngram" not in rep["missing"]
    ngram = [r for r in rep["runs"] if r["baseline"] == "ngram"]
    assert len(ngram) == 4 and all(r["n_decoded"] == 40 and r["decode_s"] == 2.0 and r["n_target_calls"] == 28
                                   for r in ngram)
    for cat, per in rep["summary"].items():
        plain, _ = _rate(rep, "plain", cat, 0)
        assert np.isclose(per["ngram"]["speedup"]["median"], 20.0 / plain, rtol=1e-9)
        assert np.isclose(per["ngram"]["tau"]["median"], 40 / 28)
        assert "upstream" not in per
    argv = log.read_text().splitlines()
    ngram_argv = [a.split() for a in argv if "ngram-simple" in a]
    assert ngram_argv and all("--no-escape" in a and a[a.index("-n") + 1] == "23" and a[a.index("-t") + 1] == "2"
                              and a[a.index("-ctk") + 1] == a[a.index("-ctv") + 1] == "f16"
                              for a in ngram_argv[1:])          # [0] is the availability probe
    assert any("-md" in a and str(drafter) in a for a in argv if "draft-dflash" in a)
    # the fake tool always says 3 prompt tokens: every prompt where ours differs is flagged
    differ = {r["prompt_id"] for r in rep["runs"] if r["baseline"] == "plain" and r["n_prompt"] != 3}
    assert {w.split(" for ")[1].split(",")[0] for w in rep["warnings"]} == differ


def test_prompt_file_round_trip(tmp_path):
    """speculative-simple drops one trailing newline of -f; we add one so the prompt arrives exact."""
    tools = _fake_tool(tmp_path / "tools", f"""while [ "$1" != "-f" ]; do shift; done; cp "$2" {tmp_path}/got.txt
cat >&2 <<'EOF'
{FAKE_LOG.format(n_prompt=5, n_dec=40, sec="0.500")}EOF
""")
    text = 'def f(x):\n    """a\\nb"""\n'
    u = upstream.run(tools, "ngram", tmp_path / "m.gguf", text, 8, drafter=None, draft_max=3, threads=1, n_ctx=256,
                     n_gpu_layers=0)
    assert (tmp_path / "got.txt").read_text() == text + "\n"
    assert (u.n_prompt, u.n_decoded, u.decode_s, u.n_drafted, u.n_accepted, u.n_target_calls) == (5, 40, 0.5, 30, 12, 28)


@pytest.mark.slow
def test_real_upstream_tools(files):
    """Upstream's DFlash driver and n-gram mode, built from our patched tree, run on our files."""
    from dflash_gguf.native.build import tool_path
    assert tool_path(upstream.TOOL).parent == upstream.tools_dir()     # builds it when missing (~2 min)
    out = files[3] / "real.json"
    # patch 0022 flushes upstream's asynchronous log at exit: before it, a loaded machine lost the counters
    # of all three attempts (exit 0, no timings) in CI
    _bench(files, "--baselines", "upstream,ngram", "--draft-max", "3", "--limit", "1", "--json", str(out), threads=1)
    rep = json.loads(out.read_text())
    assert rep["missing"] == {}, rep["missing"]
    for b in ("upstream", "ngram"):
        runs = [r for r in rep["runs"] if r["baseline"] == b]
        assert len(runs) == 3 and all(r["n_decoded"] > 0 and r["decode_s"] > 0 for r in runs)
    assert all(r["n_drafted"] <= 3 * r["n_target_calls"] for r in rep["runs"] if r["baseline"] == "upstream")
    assert "--spec-draft-n-max 3" in rep["upstream_commands"]["upstream"]


def test_lost_log_is_retried_then_missing(tmp_path):
    """speculative-simple's async logger can drop its summary under load (exit 0): retry, then say so."""
    count = tmp_path / "count"
    tools = _fake_tool(tmp_path / "tools", f"""echo x >> {count}
[ "$(wc -l < {count})" -lt 2 ] && exit 0
cat >&2 <<'EOF'
{FAKE_LOG.format(n_prompt=5, n_dec=40, sec="0.500")}EOF
""")
    settings = dict(drafter=None, draft_max=3, threads=1, n_ctx=256, n_gpu_layers=0)
    u = upstream.run(tools, "ngram", tmp_path / "m.gguf", "t1", 8, **settings)
    assert u.attempts == 2 and u.n_decoded == 40
    silent = _fake_tool(tmp_path / "silent", "exit 0\n")
    with pytest.raises(upstream.BaselineMissing, match="printed no timings"):
        upstream.run(silent, "ngram", tmp_path / "m.gguf", "t1", 8, **settings)


def test_cost_curve_report_averages_the_sizes_both_curves_measured():
    """A calibration on a slow spell measures fewer sizes (1, 2, the largest; drafts of 1 and draft_max), so the
    curves before and after a bench can differ in their keys: the report averages what both have (it raised
    KeyError: 3 on the GPU window's CPU dry run)."""
    from dflash_gguf.bench.measure import cost_curve_report
    from dflash_gguf.engine.cost import CostCurve
    full = CostCurve({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 8: 2.4}, 0.5, short_blocks=True,
                     t_draft_n={1: 0.2, 2: 0.25, 3: 0.3, 7: 0.5})
    slow = CostCurve({1: 3.0, 2: 3.6, 8: 7.2}, 1.5, short_blocks=True, t_draft_n={1: 0.6, 7: 1.5})
    for start, end in ((full, slow), (slow, full)):
        report = cost_curve_report(True, start, end)
        assert report["t_s"] == {1: 2.0, 2: 2.4, 8: 4.8}
        assert report["t_draft_n_s"] == {1: 0.4, 7: 1.0}
        assert report["ratios"][8] == pytest.approx(2.4)


@pytest.mark.parametrize("which", ["gemma3", "smollm2"])
def test_tools_read_the_prompt_we_tokenized(which):
    """llama.cpp's tools add BOS to a prompt file themselves: Gemma's template writes it into the text as well,
    so the text they read drops it (two BOS made the n-gram arm decode another prompt); SmolLM2's has none."""
    from dflash_gguf.bench.prompts import text_for_tools
    from dflash_gguf.native.wrappers import Model
    from dflash_gguf.packaged_models import gemma3_270m, smollm2
    from dflash_gguf.textgen.chat import render_model_chat
    model = Model(gemma3_270m() if which == "gemma3" else smollm2("q4_1"))
    text = render_model_chat(model, [{"role": "user", "content": "Name three rivers."}])
    tokens = model.tokenize(text, add_special=False)
    for_tools = text_for_tools(model, text, tokens)
    assert model.tokenize(for_tools, add_special=True) == tokens
    assert (for_tools != text) == (which == "gemma3")


PERSONA = [{"role": "system", "content": "You are DebHelp. Answer with one sh code block."},
           {"role": "user", "content": "How do I list held packages?"}]


def test_prompt_rows_take_a_whole_chat_request(tmp_path):
    """A row may give `messages` (a desktop app's request, system prompt included) instead of `prompt`."""
    from dflash_gguf.bench.prompts import read_rows
    f = tmp_path / "persona.jsonl"
    f.write_text(json.dumps({"id": "a", "category": "chat", "messages": PERSONA}) + "\n"
                 + json.dumps({"id": "b", "prompt": "hello"}) + "\n")
    a, b = read_rows([f], None)
    assert a == {"id": "a", "category": "chat", "prompt": PERSONA[-1]["content"], "messages": PERSONA}
    assert b == {"id": "b", "category": "persona", "prompt": "hello"}


@pytest.mark.parametrize("row, message", [
    ({"prompt": "x", "messages": PERSONA}, "not both"),
    ({"messages": PERSONA, "format": "completion"}, "a completion row gives 'prompt'"),
    ({"messages": []}, "non-empty list"),
    ({"messages": "hi"}, "non-empty list"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0] must be"),
    ({"messages": [{"role": "user", "content": ""}]}, "messages[0] must be"),
    ({"messages": PERSONA[:1]}, "the last of 'messages' must be the user's turn"),
    ({"text": "x"}, "a 'prompt' or a 'messages' field"),
    ([1, 2], "a 'prompt' or a 'messages' field"),
])
def test_bad_chat_request_rows_are_refused_with_file_and_line(tmp_path, row, message):
    from dflash_gguf.bench.prompts import read_rows
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(UserError) as e:
        read_rows([f], None)
    assert f"{f}:2" in str(e.value) and message in str(e.value)


def test_a_chat_request_row_reads_as_serve_renders_it(tmp_path):
    """bench's prompts and `bench --tau`'s both render the whole request (system turn included) through the
    target's template, the tokens `serve` decodes for that request."""
    from types import SimpleNamespace

    from dflash_gguf.bench.prompts import prepare, read_rows
    from dflash_gguf.native.wrappers import Model
    from dflash_gguf.packaged_models import smollm2
    from dflash_gguf.textgen.chat import render_model_chat
    from dflash_gguf.textgen.prompting import format_prompt
    f = tmp_path / "persona.jsonl"
    f.write_text(json.dumps({"category": "code", "messages": PERSONA}) + "\n")
    rows = read_rows([f], None)
    model = Model(smollm2("q4_1"))
    try:
        (bp,) = prepare(rows, SimpleNamespace(target_model=model))
        want = model.tokenize(render_model_chat(model, PERSONA), add_special=False)
        assert bp.tokens == want == format_prompt(model, rows[0])
        assert PERSONA[0]["content"] in bp.text and bp.category == "code"
        alone = model.tokenize(render_model_chat(model, PERSONA[1:]), add_special=False)
        assert alone != want
    finally:
        model.close()


def test_bench_runs_a_chat_request_file(files):
    target, drafter, _, d = files
    f = d / "requests.jsonl"
    f.write_text(json.dumps({"id": "r", "category": "chat", "messages": [
        {"role": "system", "content": "t3 t4"}, {"role": "user", "content": "t5 t6 t7"}]}) + "\n")
    out = d / "requests.json"
    _bench((target, drafter, f, d), "--baselines", "plain,dflash", "--json", str(out))
    rep = json.loads(out.read_text())
    assert {x["baseline"] for x in rep["runs"]} == {"plain", "dflash"}
    assert all(x["category"] == "chat" for x in rep["runs"])


def test_bench_drafts_from_a_learn_store_with_learned(files):
    """--learned: the lookup arms also draft from the answers a learn store holds for this target (here the plain
    answers to the bench's own prompts, recorded as serve --learn records them): tokens drafted from them are
    accepted, every output still equals plain, the report says what was read; a store of another target, a missing
    folder, or --learned with --tau are refused in one line."""
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.learn.store import LearnStore, Recorder, Tags
    from dflash_gguf.settings import EngineSettings
    target, drafter, prompts, d = files
    store = d / "learned"
    engine = Engine(EngineSettings(target=target, drafter=drafter, n_threads=2))
    try:
        rec = Recorder(LearnStore(store), target)
        for line in prompts.read_text().splitlines():
            tokens = engine.tokenize(json.loads(line)["prompt"])
            rec.record(tokens, engine.generate(tokens, 24, speculative=False).tokens, template=None, drafter=None)
    finally:
        engine.close()
    out = d / "learned.json"
    _bench(files, "--baselines", "plain,lookup,hybrid", "--learned", str(store), "--json", str(out))
    rep = json.loads(out.read_text())
    assert rep["learned"]["store"] == str(store) and rep["learned"]["answers"] == 4
    assert all(r["matches_plain"] for r in rep["runs"] if r["baseline"] != "plain")
    assert sum(r["n_corpus_accepted"] for r in rep["runs"]) > 0
    other = d / "other"
    LearnStore(other).record(Tags("o.gguf", "f" * 64), [1], [1, 2, 3, 4, 5])
    for extra, message in ((("--learned", str(other)), "no answers recorded with tiny.gguf"),
                           (("--learned", str(d / "none")), "no such folder"),
                           (("--learned", str(store), "--tau"), "no effect with --tau")):
        r = CliRunner().invoke(app, ["bench", "-m", str(target), "-md", str(drafter), "--prompts", str(prompts),
                                     "-n", "8", *extra])
        assert r.exit_code != 0 and message in r.output + str(r.exception), r.output
