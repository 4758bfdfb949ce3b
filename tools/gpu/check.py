#!/usr/bin/env python3
"""GPU check: build, test and benchmark the CUDA path in one short window of a lent GPU machine.

Runs named steps, each a subprocess with its own time limit; a failed or timed-out step is recorded and
the next one runs. State (bundle files, Python packages, the CUDA build, generated models, results) lives
in --state and survives between commands on the same warm machine, so a window of 10-minute commands
runs the steps in groups (`--steps setup,build+train`, then `--steps setup,tests,...`). After every step
the accumulated results go to <out>/gpu-check.json and the logs to <out>/gpu-check.log.

Steps (in the order of `--steps all`, most valuable first):
  setup     take in the carried bundle units, unpack the prebuilt libraries and llama.cpp, install missing wheels
            (tools/gpu/setup_env.py)
  build     the patched libraries + llama-speculative-simple + llama-bench for --backend: the prebuilt ones when
            they are this tree's build (nothing compiles), else compiled here (CUDA: --cuda-arch); then `doctor`
  tests     the tests marked `gpu` (with the full profile a skip counts as a failure)
  verify8b  t(B)/t(1), B = 1..16, of a random-weight Qwen3-8B-shape Q4_K_M generated here: ours (`bench --cost-curve-only`)
            beside stock llama.cpp (llama-bench, tools/gpu/stock_curve.py)
  moe       a random-weight Qwen3-MoE-shape GGUF: tok/s with --n-cpu-moe / --cpu-moe / --fit vs all on the GPU
  bench     `dflash-gguf bench -ngl 99`: plain, ours, upstream C++ DFlash, n-gram on the bundled prompts
  verify    the t(B)/t(1) curve of SmolLM2 Q4_1 with every layer on the GPU
  train     tools/gpu/train.sh OUT if it exists (drafter training; skipped otherwise)
`a+b` runs two steps at once. Whether greedy output on the device equals plain decoding is gathered from the
tests and the bench into `greedy_equals_plain` of the report. Profile `tiny` (tiny models, small counts, no
device required) is the dry run: `--backend cpu`, or `--backend cuda --profile tiny` on a machine without a GPU,
where the CUDA build loads, says why it offers no device, and runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from report import render_table  # noqa: E402

sys.path.insert(0, str(ROOT))
from dflash_gguf.native.cuda_toolchain import runtime_lib_dirs as cuda_runtime_dirs  # noqa: E402 (stdlib only)

STEPS = ("setup", "build", "tests", "verify8b", "moe", "bench", "verify", "probe", "train")
# a 15-minute window: the limits keep the first call (setup, build, tests, verify8b) under 8 minutes; a compile
# (no prebuilt for this tree) needs --timeout build=400
TIMEOUTS = {"setup": 90, "build": 60, "tests": 180, "verify8b": 240, "moe": 240, "bench": 300, "verify": 120,
            "probe": 180, "train": 520}
TOOLS = ["llama-speculative-simple", "llama-bench"]
PROFILES = {   # full: the H100 run the issue asks for; tiny: the CPU dry run (same steps, small everything)
    "full": dict(bench_limit=10, n_predict=128, repeat=2, max_batch=16, lookup_max=32, reps=7, dense="qwen3-8b",
                 moe="qwen3-moe", moe_n_predict=64, moe_repeat=2, probe="smollm2-135m", probe_rounds=6),
    "tiny": dict(bench_limit=1, n_predict=8, repeat=1, max_batch=4, lookup_max=3, reps=2, dense="tiny-dense",
                 moe="tiny-moe", moe_n_predict=8, moe_repeat=1, probe="tiny-dense", probe_rounds=2),
}
LOG_TAIL_BYTES = 2 << 20        # per step in the returned log (the state folder keeps everything)


@dataclass
class Cmd:
    argv: list[str]
    stdout: Path | None = None      # None: into the step's log


@dataclass
class Check:
    args: argparse.Namespace
    state: Path
    out: Path
    cache: Path
    profile: dict
    results: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def env_info(self) -> dict:
        p = self.state / "env.json"
        return json.loads(p.read_text()) if p.is_file() else {}

    @property
    def python(self) -> str:
        return self.env_info.get("python") or sys.executable

    @property
    def device_required(self) -> bool:
        return self.args.profile == "full"

    def env(self) -> dict:
        env = dict(os.environ, DFLASH_GGUF_CACHE=str(self.cache), OUT=str(self.out), PYTHON=self.python,
                   DFLASH_GGUF_BACKEND=self.args.backend,
                   PYTHONPATH=os.pathsep.join(self.env_info.get("pythonpath") or [str(ROOT)]))
        if self.device_required:
            env["DFLASH_GGUF_REQUIRE_GPU"] = "1"      # the gpu tests fail instead of skipping
        if self.args.backend == "cuda":
            toolkit = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))   # nvcc (a compile) off the PATH
            if (toolkit / "bin").is_dir():
                env["PATH"] = os.pathsep.join(filter(None, [env.get("PATH"), str(toolkit / "bin")]))
            # a prebuilt build's rpath names the CPU machine's toolkit: find this machine's cudart and cuBLAS
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [env.get("LD_LIBRARY_PATH"),
                                                                   *map(str, cuda_runtime_dirs())]))
        return env

    def models(self) -> Path:
        return self.state / "models"


# ---- the steps: commands, then what their outputs say ---------------------------------------------------

def _threads(c: Check) -> int:
    return c.args.threads or os.cpu_count() or 1


def cmd_setup(c: Check) -> list[Cmd]:
    return [Cmd([sys.executable, str(HERE / "setup_env.py"), "--bundle", str(c.args.bundle), "--state", str(c.state),
                 "--cache", str(c.cache), "--repo", str(ROOT), "--python", c.args.python or sys.executable],
                c.state / "setup.json")]


def cmd_train(c: Check) -> list[Cmd]:
    return [Cmd(["bash", str(c.args.train_script), str(c.out)])] if c.args.train_script.is_file() else []


def cmd_build(c: Check) -> list[Cmd]:
    if c.args.lib_cache:   # a copy of this machine's build of the same key (the CPU dry run); never written to
        src, dst = c.args.lib_cache / "native" / "lib", c.cache / "native" / "lib"
        for d in src.glob(f"*-{c.args.backend}"):
            if (d / "build.json").is_file() and not (dst / d.name).exists():
                shutil.copytree(d, dst / d.name, symlinks=True)
    code = ("import sys; from dflash_gguf.native.build import build; "
            "print(build(sys.argv[1], int(sys.argv[2]) or None, sys.argv[4].split(','), sys.argv[3] or None))")
    return [Cmd([c.python, "-c", code, c.args.backend, str(c.args.jobs), c.args.cuda_arch or "", ",".join(TOOLS)]),
            Cmd([c.python, "-m", "dflash_gguf.cli", "doctor", "--json"], c.state / "doctor.json")]


def gpu_test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if re.search(r"pytest\.mark\.gpu\b", p.read_text(encoding="utf-8")))


def cmd_tests(c: Check) -> list[Cmd]:
    return [Cmd([c.python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "gpu",
                 "--junitxml", str(c.state / "tests.xml"), *gpu_test_files()])]


def _curve(c: Check, name: str, model: Path | None = None) -> Cmd:
    """`bench --cost-curve-only`: the engine's own t(B) for B up to the longest verify the profile lets the loop
    make (a lookup draft of lookup_max + 1); a model without a drafter (a random one) through the lookup source, i.e.
    the verify curve alone."""
    target = ["-m", str(model), "--draft-source", "lookup"] if model else []
    return Cmd([c.python, "-m", "dflash_gguf.cli", "bench", "--cost-curve-only", *target,
                "--draft-max", str(c.profile["max_batch"] - 1), "--lookup-max", str(c.profile["lookup_max"]),
                "-ngl", "99", "-t", str(_threads(c)),
                "--json", str(c.state / f"{name}.json")])


def cmd_verify(c: Check) -> list[Cmd]:
    return [_curve(c, "verify")]


def cmd_probe(c: Check) -> list[Cmd]:
    """t(B) in the calibration's order against the same width back to back (tools/gpu/shape_probe.py), with CUDA
    graphs kept per shape (patches/0021) and keyed by the first node alone (upstream), and stock llama-bench's
    pp B on the same random model"""
    p = c.profile
    probe = [c.python, str(HERE / "shape_probe.py"), "--out", str(c.state / "probe"), "--threads", str(_threads(c)),
             "--shape", p["probe"], "--ftype", "q4_1", "--rounds", str(p["probe_rounds"])]
    stock = [c.python, str(HERE / "stock_curve.py"), "--bench", _tool(c, "llama-bench"), "--model",
             str(c.state / "probe" / f"{p['probe']}-q4_1.gguf"), "--max-batch", "16", "--reps", str(p["reps"]),
             "--threads", str(_threads(c)), "-ngl", "99"]
    return [Cmd(probe), Cmd([*probe, "--graph-key", "node"]), Cmd(stock, c.state / "probe-stock.json")]


def parse_probe(c: Check) -> tuple[bool, dict]:
    probe = _json(c.state / "probe" / "shape-probe.json")
    node = _json(c.state / "probe" / "shape-probe-node.json")
    return probe is not None and node is not None, (probe or {}) | {"first_node_key": node}


def _random_model(c: Check, shape: str, name: str) -> tuple[Cmd, Path]:
    path = c.models() / f"{shape}-random-q4_k_m.gguf"
    return Cmd([c.python, str(HERE / "random_gguf.py"), "--shape", shape, "--ftype", "q4_k_m", "-o", str(path)],
               c.state / f"{name}-model.json"), path


def _tool(c: Check, name: str) -> str:
    lib_dir = (_json(c.state / "doctor.json") or {}).get("lib_dir")
    return str(Path(lib_dir) / "tools" / name) if lib_dir else name


def cmd_verify8b(c: Check) -> list[Cmd]:
    p = c.profile
    gen, path = _random_model(c, p["dense"], "verify8b")
    stock = Cmd([c.python, str(HERE / "stock_curve.py"), "--bench", _tool(c, "llama-bench"), "--model", str(path),
                 "--max-batch", str(p["max_batch"]), "--reps", str(p["reps"]), "--threads", str(_threads(c)),
                 "-ngl", "99"], c.state / "verify8b-stock.json")
    return [gen, _curve(c, "verify8b", path), stock]


def cmd_bench(c: Check) -> list[Cmd]:
    p = c.profile
    prompts = c.env_info.get("prompts") or []
    return [Cmd([c.python, "-m", "dflash_gguf.cli", "bench", "--prompts", *prompts, "--limit", str(p["bench_limit"]),
                 "-n", str(p["n_predict"]), "--repeat", str(p["repeat"]), "-ngl", "99", "-t", str(_threads(c)),
                 "--json", str(c.state / "bench.json")])]


def cmd_moe(c: Check) -> list[Cmd]:
    p = c.profile
    gen, path = _random_model(c, p["moe"], "moe")
    return [gen, Cmd([c.python, str(HERE / "moe_offload.py"), "--model", str(path), "--ours",
                      "-n", str(p["moe_n_predict"]), "-t", str(_threads(c)), "--repeat", str(p["moe_repeat"])],
                     c.state / "moe.json")]


def _json(path: Path):
    return json.loads(path.read_text()) if path.is_file() and path.stat().st_size else None


def parse_setup(c: Check) -> tuple[bool, dict]:
    env = _json(c.state / "setup.json") or {}
    return not env.get("still_missing"), env


def _unresolved_libs(c: Check, lib_dir: str | None) -> list[str] | None:
    """`ldd` of the CUDA library with the steps' environment: the shared libraries it cannot find."""
    lib = Path(lib_dir or "") / "libggml-cuda.so"
    if c.args.backend != "cuda" or not lib.is_file() or not shutil.which("ldd"):
        return None
    out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, env=c.env()).stdout
    return [line.strip() for line in out.splitlines() if "not found" in line]


def parse_build(c: Check) -> tuple[bool, dict]:
    doc = _json(c.state / "doctor.json") or {}
    gpus = [d for d in doc.get("devices", []) if d["name"].upper().startswith(("CUDA", "ROCM", "METAL"))]
    ok = (doc.get("ok") is True and doc.get("built_backend") == c.args.backend
          and set(TOOLS) <= set(doc.get("tools_built", [])))
    if c.device_required:
        ok = ok and bool(gpus)
    compiled = "configure:" in (c.state / "logs" / "build.log").read_text(errors="replace")
    return ok, {k: doc.get(k) for k in ("ok", "built_backend", "lib_dir", "tools_built", "devices", "system_info",
                                        "hint", "error")} | {"gpus": gpus, "compiled": compiled,
                                                             "cuda_runtime_dirs": c.env().get("LD_LIBRARY_PATH")
                                                             if c.args.backend == "cuda" else None,
                                                             "unresolved_libs": _unresolved_libs(c, doc.get("lib_dir"))}


def parse_tests(c: Check) -> tuple[bool, dict]:
    xml = c.state / "tests.xml"
    if not xml.is_file():
        return False, {"error": "no junit report"}
    suite = ET.parse(xml).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}: {(case[0].get('message') or '')[:300]}"
              for case in suite.iter("testcase") if len(case) and case[0].tag in ("failure", "error")]
    ok = counts["tests"] > 0 and counts["failures"] == counts["errors"] == 0
    if c.device_required:
        ok = ok and counts["skipped"] == 0
    outcome = {f"{case.get('classname')}::{case.get('name')}":
               case[0].tag if len(case) and case[0].tag in ("failure", "error", "skipped") else "passed"
               for case in suite.iter("testcase")}
    return ok, counts | {"failed": failed, "files": gpu_test_files(), "outcome": outcome}


def _curve_details(path: Path) -> dict | None:
    d = _json(path)
    if not d:
        return None
    curve = d["cost_curve"]
    return {"model": d["target"], "drafter": d["drafter"], "n_gpu_layers": d.get("n_gpu_layers"),
            "backend": d.get("backend"), "t1_ms": 1e3 * curve["t_s"]["1"], "ratios": curve["ratios"],
            "median_ms": {b: 1e3 * t for b, t in curve["t_s"].items()}, "t_draft_ms": 1e3 * curve["t_draft_s"]}


def parse_verify(c: Check) -> tuple[bool, dict]:
    d = _curve_details(c.state / "verify.json")
    return d is not None, d or {}


def parse_verify8b(c: Check) -> tuple[bool, dict]:
    d = _curve_details(c.state / "verify8b.json")
    stock = _json(c.state / "verify8b-stock.json")
    stock = stock and {"tool": stock["tool"], "device": stock["device"], "t1_ms": stock["batches"]["1"]["median_ms"],
                       "ratios": {b: v["ratio"] for b, v in stock["batches"].items()},
                       "median_ms": {b: v["median_ms"] for b, v in stock["batches"].items()}}
    return d is not None and bool(stock), (d or {}) | {"generated": _json(c.state / "verify8b-model.json"),
                                                       "stock": stock}


def parse_bench(c: Check) -> tuple[bool, dict]:
    rep = _json(c.state / "bench.json")
    if not rep:
        return False, {"error": "no bench report"}
    summary = {cat: {b: {k: e.get(k) for k in ("tok_s", "tau", "speedup")} | (
        {"identical_to_plain": e["all_repeats"].get("identical_to_plain")} if "all_repeats" in e else {})
        for b, e in per.items()} for cat, per in rep["summary"].items()}
    details = {k: rep.get(k) for k in ("target", "drafter", "prompts", "per_category", "n_predict", "repeat",
                                       "n_gpu_layers", "backend", "machine", "date", "missing", "draft_max")}
    details |= {"cost_ratios": rep["cost_curve"]["ratios"], "summary": summary}
    return not rep.get("missing"), details


def parse_moe(c: Check) -> tuple[bool, dict]:
    d = _json(c.state / "moe.json")
    return d is not None, (d or {}) | {"generated": _json(c.state / "moe-model.json")}


def parse_train(c: Check) -> tuple[bool, dict]:
    return True, {"script": str(c.args.train_script)}


def greedy_equals_plain(results: dict) -> dict:
    """Question (f): is greedy output on the device equal to plain decoding? The device tests that compare them
    token for token, and the bench's per-method comparison of every prompt's output with plain decoding."""
    steps = results.get("steps", {})
    tests = ((steps.get("tests") or {}).get("details") or {}).get("outcome") or {}
    greedy = {name: st for name, st in tests.items() if "greedy" in name or "equals_plain" in name}
    bench = ((steps.get("bench") or {}).get("details") or {}).get("summary", {}).get("all", {})
    same = {b: e["identical_to_plain"] for b, e in bench.items() if e.get("identical_to_plain") is not None}  # plain: None
    verdicts = [st == "passed" for st in greedy.values() if st != "skipped"] + [
        isinstance(v, str) and v.partition("/")[0] == v.partition("/")[2] for v in same.values()]   # "k/n" prompts
    return {"answer": None if not verdicts else all(verdicts), "tests": greedy, "bench_identical_to_plain": same,
            "device": ((steps.get("build") or {}).get("details") or {}).get("gpus")}


COMMANDS = {"setup": cmd_setup, "train": cmd_train, "build": cmd_build, "tests": cmd_tests, "verify": cmd_verify,
            "verify8b": cmd_verify8b, "bench": cmd_bench, "moe": cmd_moe, "probe": cmd_probe}
WRITES = {"tests": ("tests.xml",), "bench": ("bench.json",)}     # reports the programs write themselves
PARSERS = {"setup": parse_setup, "train": parse_train, "build": parse_build, "tests": parse_tests,
           "verify": parse_verify, "verify8b": parse_verify8b, "bench": parse_bench, "moe": parse_moe,
           "probe": parse_probe}


# ---- running ---------------------------------------------------------------------------------------------

def _run(cmd: Cmd, env: dict, log, seconds: float) -> int | str:
    """Exit code, or 'timeout' (the whole process group is killed)."""
    log.write(f"$ {' '.join(cmd.argv)}" + (f" > {cmd.stdout}" if cmd.stdout else "") + "\n")
    log.flush()
    out = open(cmd.stdout, "w") if cmd.stdout else log
    try:
        proc = subprocess.Popen(cmd.argv, cwd=ROOT, env=env, stdout=out, stderr=log, start_new_session=True)
        try:
            return proc.wait(timeout=max(seconds, 1))
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
            return "timeout"
    finally:
        if cmd.stdout:
            out.close()


def run_step(c: Check, name: str) -> dict:
    timeout = c.args.timeouts.get(name, TIMEOUTS[name])
    log_path = c.state / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = {"status": "running", "started": time.strftime("%Y-%m-%d %H:%M:%S"), "timeout_s": timeout}
    _record(c, name, res)
    with open(log_path, "w") as log:
        cmds = COMMANDS[name](c)
        if not cmds:
            res |= {"status": "skipped", "reason": f"{c.args.train_script} does not exist", "seconds": 0.0}
            _record(c, name, res)
            return res
        for stale in [cmd.stdout for cmd in cmds if cmd.stdout] + [c.state / f for f in WRITES.get(name, ())]:
            stale.unlink(missing_ok=True)        # a report left by an earlier run must not pass for this one
        rc: int | str = 0
        for cmd in cmds:
            rc = _run(cmd, c.env(), log, timeout - (time.time() - t0))
            res.setdefault("commands", []).append(" ".join(cmd.argv))
            if rc != 0:
                break
        try:
            ok, details = PARSERS[name](c)
        except Exception as e:  # a report that cannot be read is this step's failure, not the check's
            ok, details = False, {"parse_error": f"{type(e).__name__}: {e}"}
        status = "timeout" if rc == "timeout" else "passed" if rc == 0 and ok else "failed"
        log.write(f"[check] {name}: {status} (rc {rc}) in {time.time() - t0:.1f} s\n")
    res |= {"status": status, "rc": rc, "seconds": round(time.time() - t0, 1), "details": details}
    _record(c, name, res)
    return res


def _record(c: Check, name: str, res: dict) -> None:
    with c.lock:
        c.results.setdefault("steps", {})[name] = dict(res)
        write_outputs(c)


def write_outputs(c: Check) -> None:
    steps = c.results.get("steps", {})
    c.results["summary"] = {s: steps[s]["status"] for s in STEPS if s in steps}
    c.results["all_passed"] = all(st in ("passed", "skipped") for st in c.results["summary"].values())
    c.results["greedy_equals_plain"] = greedy_equals_plain(c.results)
    try:
        c.results["table_md"] = render_table(c.results)
    except Exception as e:  # the table is a convenience: never lose the results over it
        c.results["table_md"] = f"(no table: {type(e).__name__}: {e})"
    text = json.dumps(c.results, indent=1)
    (c.state / "results.json").write_text(text)
    c.out.mkdir(parents=True, exist_ok=True)
    (c.out / "gpu-check.json").write_text(text)
    with open(c.out / "gpu-check.log", "w") as log:
        log.write(json.dumps(c.results["summary"]) + "\n\n" + c.results["table_md"] + "\n")
        for s in STEPS:
            p = c.state / "logs" / f"{s}.log"
            if s in steps and p.is_file():
                size = p.stat().st_size
                with open(p, "rb") as f:
                    f.seek(max(size - LOG_TAIL_BYTES, 0))
                    log.write(f"\n===== {s}: {steps[s]['status']} =====\n")
                    log.write(f.read().decode("utf-8", "replace"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="all", help="comma list of steps; a+b runs two at once (default: all)")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--profile", choices=sorted(PROFILES), default=None, help="default: full on cuda, tiny on cpu")
    ap.add_argument("--cuda-arch", default="90")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / ".gpu-state" / "out"))
    ap.add_argument("--state", type=Path, default=ROOT / ".gpu-state")
    ap.add_argument("--bundle", type=Path, default=ROOT / ".gpu-bundle")
    ap.add_argument("--cache", type=Path, default=None, help="DFLASH_GGUF_CACHE (default: <state>/cache)")
    ap.add_argument("--lib-cache", type=Path, default=None,
                    help="a dflash-gguf cache whose native build of the same key is reused (the CPU dry run)")
    ap.add_argument("--python", default=None, help="Python for the steps (default: the one running this)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    ap.add_argument("--jobs", type=int, default=0, help="build jobs (0: all cores)")
    ap.add_argument("--train-script", type=Path, default=HERE / "train.sh")
    ap.add_argument("--timeout", action="append", default=[], metavar="STEP=SECONDS")
    a = ap.parse_args(argv)
    a.timeouts = {}
    for t in a.timeout:
        step, _, sec = t.partition("=")
        if step not in STEPS or not sec.replace(".", "", 1).isdigit():
            ap.error(f"--timeout {t}: expected STEP=SECONDS with STEP one of {', '.join(STEPS)}")
        a.timeouts[step] = float(sec)
    groups = [g.split("+") for g in (",".join(STEPS) if a.steps == "all" else a.steps).split(",") if g]
    unknown = [s for g in groups for s in g if s not in STEPS]
    if unknown:
        ap.error(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    a.groups = groups
    a.profile = a.profile or ("full" if a.backend == "cuda" else "tiny")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.state = a.state.resolve()
    c = Check(a, a.state, a.out.resolve(), (a.cache or a.state / "cache").resolve(), PROFILES[a.profile])
    c.state.mkdir(parents=True, exist_ok=True)
    c.results = _json(c.state / "results.json") or {}
    for r in c.results.get("steps", {}).values():     # a command killed at its time limit left these behind
        if r.get("status") == "running":
            r["status"] = "interrupted"
    c.results.setdefault("invocations", []).append(
        {"argv": sys.argv[1:] if argv is None else argv, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
         "backend": a.backend, "profile": a.profile, "host": platform.node(), "cpus": os.cpu_count()})
    for group in a.groups:
        threads = [threading.Thread(target=run_step, args=(c, s)) for s in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    write_outputs(c)
    print(json.dumps(c.results["summary"]))
    print(c.results["table_md"])
    return 0 if all(c.results["steps"][s]["status"] in ("passed", "skipped") for g in a.groups for s in g) else 1


if __name__ == "__main__":
    sys.exit(main())
