"""The GPU check (tools/gpu) cannot rot: its CPU dry run goes through every step of the script the GPU
machine runs, from a bundle made here, with tiny models; plus the bundle's chunking and the step runner's
handling of failures and time limits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.gpu import bundle, check, setup_env

ROOT = Path(__file__).resolve().parent.parent
GPU_TOOLS = ROOT / "tools" / "gpu"


def _check(tmp: Path, *args: str, timeout: int = 1800) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ)
    env.pop("DFLASH_GGUF_CACHE", None)   # the check sets its own
    proc = subprocess.run(["bash", str(GPU_TOOLS / "check.sh"), "--backend", "cpu", "--state", str(tmp / "state"),
                           "--out", str(tmp / "out"), *args], capture_output=True, text=True, timeout=timeout, env=env)
    report = json.loads((tmp / "out" / "gpu-check.json").read_text())
    return proc, report


def _prompts(d: Path) -> Path:
    d.mkdir(parents=True)
    for cat, text in (("code", "def add(a, b):\n"), ("math", "What is 12 times 7?"), ("chat", "Name a colour.")):
        (d / f"{cat}.jsonl").write_text(json.dumps({"id": f"{cat}/0", "category": cat, "prompt": text}) + "\n")
    return d


@pytest.mark.slow
def test_cpu_dry_run_passes_every_step(tmp_path):
    from dflash_gguf.native.build import LLAMA_CPP_PYTHON_VERSION, build
    assert setup_env.SDIST_DIR == f"sdist-{LLAMA_CPP_PYTHON_VERSION}"     # where build.py looks for the source
    # this machine's CPU build with the window's tools stands in for the prebuilt CUDA one: it travels, and the
    # window's build step finds it and compiles nothing
    prebuilt = build("cpu", tools=check.TOOLS)
    subprocess.run([sys.executable, str(GPU_TOOLS / "bundle.py"), "-o", str(tmp_path / "bundle"), "--wheels", "none",
                    "--prebuilt", str(prebuilt), "--prompts-dir", str(_prompts(tmp_path / "prompts")),
                    "--prompts-per-category", "1", "--unit-mib", "40"], check=True, capture_output=True)
    units = sorted(p.name for p in (tmp_path / "bundle").iterdir())
    assert len(units) >= 3                                 # SmolLM2 (94 MiB) is cut across units
    manifest = json.loads((tmp_path / "bundle" / "unit-1" / "manifest.json").read_text())
    assert next(iter(manifest["files"])) == f"prebuilt/{prebuilt.name}.tar.xz"     # the first call's unit
    train = tmp_path / "train.sh"
    train.write_text('echo "trained into $1" > "$1/train-ran.txt"\n')
    proc, rep = _check(tmp_path, "--bundle", str(tmp_path / "bundle"), "--threads", "1", "--train-script", str(train),
                       "--timeout", "tests=900", "--timeout", "bench=900", "--timeout", "moe=600",
                       "--timeout", "verify8b=600", "--timeout", "verify=600", "--steps", "all")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = rep["steps"]
    assert rep["all_passed"] and set(rep["summary"]) == {"setup", "train", "build", "tests", "verify", "verify8b",
                                                           "bench", "moe", "probe"}, rep["summary"]
    assert (tmp_path / "out" / "train-ran.txt").is_file()
    assert steps["setup"]["details"]["files_missing"] == [] and steps["setup"]["details"]["source"] == "unpacked"
    assert steps["setup"]["details"]["prebuilt"] == {prebuilt.name: {"backend": "cpu", "matches_tree": True}}
    assert set(check.TOOLS) <= set(steps["build"]["details"]["tools_built"])
    assert steps["build"]["details"]["compiled"] is False and steps["build"]["details"]["lib_dir"].startswith(
        str(tmp_path / "state" / "cache"))
    tests = steps["tests"]["details"]
    assert tests["tests"] >= 6 and tests["skipped"] == tests["tests"]      # no GPU here: every gpu test skips
    assert tests["files"] == ["tests/test_gpu_backend.py", "tests/test_gpu_engine.py", "tests/test_gpu_family.py"]
    assert set(steps["verify"]["details"]["ratios"]) == {"1", "2", "3", "4"}
    assert steps["verify8b"]["details"]["generated"]["spec"]["shape"] == "tiny-dense"
    assert set(steps["verify8b"]["details"]["stock"]["ratios"]) == {"1", "2", "3", "4"}
    greedy = rep["greedy_equals_plain"]        # question (f), answered on the CPU here: every prompt matches
    assert greedy["answer"] is True and greedy["bench_identical_to_plain"]["dflash"] == "3/3", greedy   # one prompt per category
    assert greedy["tests"] and set(greedy["tests"].values()) == {"skipped"}
    bench = steps["bench"]["details"]
    assert bench["missing"] == {} and bench["per_category"] == {"code": 1, "math": 1, "chat": 1}
    assert set(bench["summary"]["all"]) == {"plain", "dflash", "lookup", "hybrid", "upstream", "ngram"}
    moe = steps["moe"]["details"]["placements"]
    assert set(moe) == {"all_gpu", "n_cpu_moe", "cpu_moe", "fit"} and all(r["tok_s"] > 0 for r in moe.values())
    assert all(moe[p]["ours"]["tok_s"] > 0 and moe[p]["ours"]["tau"] >= 1 for p in ("n_cpu_moe", "cpu_moe"))
    assert "| plain tok/s |" in rep["table_md"] and "B=4 |" in rep["table_md"] and "cpu_moe" in rep["table_md"]
    probe = steps["probe"]["details"]      # t(B) in the calibration's order and steady, on the same random model
    assert set(probe["steady"]) == set(probe["interleaved"]) == {str(b) for b in (1, 2, 3, 4, 8, 16)}
    assert all(t > 0 for t in probe["steady"].values()) and probe["model"]["spec"]["shape"] == "tiny-dense"
    node = probe["first_node_key"]         # the same, CUDA graphs keyed by the first node alone (upstream's key)
    assert probe["graph_key"] == "shape" and node["graph_key"] == "node"
    assert set(node["steady"]) == set(probe["steady"]) and all(t > 0 for t in node["interleaved"].values())
    log = (tmp_path / "out" / "gpu-check.log").read_text()
    assert all(f"===== {s}: passed" in log for s in rep["summary"])
    # the pruned llama.cpp tree the GPU machine builds from still configures with every tool enabled
    src = tmp_path / "state" / "cache" / "native" / setup_env.SDIST_DIR / "vendor" / "llama.cpp"
    from dflash_gguf.native.build import cmake_args
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "cfg"), *gen, *cmake_args("cpu", True, None)],
                         capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stderr[-3000:]


def test_failed_and_timed_out_steps_do_not_stop_the_check(tmp_path):
    slow = tmp_path / "slow.sh"
    slow.write_text("sleep 60\n")
    proc, rep = _check(tmp_path, "--bundle", str(tmp_path / "none"), "--train-script", str(slow),
                       "--timeout", "train=2", "--steps", "train,setup", timeout=120)
    assert proc.returncode == 1
    assert rep["summary"] == {"setup": "passed", "train": "timeout"} and not rep["all_passed"]
    assert rep["steps"]["train"]["seconds"] < 30                 # the sleeping script was killed
    failing = tmp_path / "fail.sh"
    failing.write_text("exit 3\n")
    proc, rep = _check(tmp_path, "--bundle", str(tmp_path / "none"), "--train-script", str(failing),
                       "--steps", "train", timeout=120)
    assert rep["steps"]["train"]["status"] == "failed" and rep["steps"]["train"]["rc"] == 3
    assert len(rep["invocations"]) == 2 and rep["summary"]["setup"] == "passed"    # results accumulate
    proc, rep = _check(tmp_path, "--train-script", str(tmp_path / "absent.sh"), "--steps", "train", timeout=120)
    assert rep["steps"]["train"]["status"] == "skipped" and proc.returncode == 0


def test_bundle_units_reassemble_in_any_order_and_check_sha256(tmp_path):
    files = {}
    for name, size in (("a.bin", 3000), ("dir/b.bin", 10), ("c.bin", 0)):
        p = tmp_path / "src" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))
        files[name] = p
    manifest = bundle.pack(files, tmp_path / "bundle", unit_bytes=1024)
    assert len(manifest["units"]) == 3 and len(manifest["files"]["a.bin"]["chunks"]) == 3
    store, carried = tmp_path / "store", tmp_path / "carried"
    for i, unit in enumerate(["unit-3", "unit-1", "unit-2"]):         # one unit per command, any order
        shutil.rmtree(carried, ignore_errors=True)
        shutil.copytree(tmp_path / "bundle" / unit, carried / unit)
        done, missing = setup_env.assemble(setup_env.take_units(carried, store), store)
        if i < 2:
            assert "a.bin" in missing
    assert sorted(done) == ["a.bin", "c.bin", "dir/b.bin"] and missing == []
    for name, src in files.items():
        assert (store / "files" / name).read_bytes() == src.read_bytes()
    bad = tmp_path / "bad"                                  # a corrupted chunk is refused
    shutil.copytree(tmp_path / "bundle", bad / "b")
    chunk = bad / "b" / "unit-1" / manifest["files"]["a.bin"]["chunks"][0]
    chunk.write_bytes(b"x" * chunk.stat().st_size)
    with pytest.raises(SystemExit, match="sha256"):
        setup_env.assemble(setup_env.take_units(bad / "b", bad / "store"), bad / "store")


def test_prebuilt_archive_packs_each_library_once(tmp_path):
    """A build installs each library under every soname and beside the tools: the copies travel as hard links,
    or libggml-cuda (37 MiB as xz) would fill three units alone (it did on 2026-12-04: 120 MiB)."""
    import tarfile
    lib = tmp_path / "0c1e57098-key-cuda"
    (lib / "tools").mkdir(parents=True)
    blob = os.urandom(1 << 20)
    for name in ("libggml-cuda.so", "libggml-cuda.so.0", "tools/libggml-cuda.so.0"):
        (lib / name).write_bytes(blob)
    (lib / "libllama.so").write_bytes(os.urandom(4096))
    (lib / "build.json").write_text("{}")
    archive = bundle.prebuilt_archive(lib, tmp_path / "cache")
    assert archive.stat().st_size < 1.5 * len(blob)
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sum(m.islnk() for m in members.values()) == 2
        tar.extractall(tmp_path / "out", filter="data")
    for name in ("libggml-cuda.so", "libggml-cuda.so.0", "tools/libggml-cuda.so.0"):
        assert (tmp_path / "out" / lib.name / name).read_bytes() == blob
    assert (tmp_path / "out" / lib.name / "libllama.so").read_bytes() == (lib / "libllama.so").read_bytes()


def test_pruned_source_keeps_what_the_build_reads():
    assert bundle._keep("ggml/src/ggml-cuda/mmq.cu") and bundle._keep("ggml/src/ggml-cpu/ggml-cpu.c")
    assert bundle._keep("examples/speculative-simple/speculative-simple.cpp") and bundle._keep("src/llama.cpp")
    assert bundle._keep("tools/ui/CMakeLists.txt") and not bundle._keep("tools/ui/package.json")
    assert not bundle._keep("models/ggml-vocab-llama-bpe.gguf") and not bundle._keep("ggml/src/ggml-vulkan/x.cpp")


def test_every_patch_applies_to_the_pruned_source(tmp_path):
    """The pruned tree drops backends the CUDA build never compiles, but a patch may touch one of them (0007
    changes ggml-vulkan.cpp): what travels must still take every patch, or the build fails on the GPU machine."""
    from dflash_gguf.native import build as nb
    src = nb.pristine_tree() / "vendor" / "llama.cpp"
    patches = sorted((ROOT / "patches").glob("*.patch"))
    kept = set(bundle.pruned_files(src, frozenset(bundle.patched_files())))
    assert {f for p in patches for f in nb.patched_files(p) if (src / f).exists()} <= kept
    pruned = tmp_path / "pruned"
    for rel in kept & bundle.patched_files():
        (pruned / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, pruned / rel)
    (tmp_path / "out").mkdir()
    assert nb.apply_patches(pruned, patches, tmp_path / "out")


def test_setup_replaces_bindings_of_another_llama_cpp_python_release(tmp_path):
    """A GPU machine's own llama-cpp-python (another release) has other C structures: setup must install the
    bundled pinned bindings over it rather than count it as present (it crashed every model load)."""
    from dflash_gguf.native.build import LLAMA_CPP_PYTHON_VERSION
    for version, missing in (("0.3.16", ["llama_cpp"]), (LLAMA_CPP_PYTHON_VERSION, [])):
        pkg = tmp_path / version / "llama_cpp"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f'from .llama_cpp import *\n\n__version__ = "{version}"\n')
        assert setup_env.missing_modules(sys.executable, ["llama_cpp", "json"], [str(ROOT), str(pkg.parent)]) == missing


def test_greedy_answer_counts_every_arm_but_plain():
    def results(same: dict) -> dict:
        summary = {"all": {arm: {"identical_to_plain": v} for arm, v in same.items()}}
        return {"steps": {"bench": {"details": {"summary": summary}}}}
    assert check.greedy_equals_plain(results({"plain": None, "dflash": "3/3", "lookup": "3/3"}))["answer"] is True
    assert check.greedy_equals_plain(results({"plain": None, "dflash": "3/3", "hybrid": "2/3"}))["answer"] is False
    assert check.greedy_equals_plain(results({"plain": None}))["answer"] is None
