"""Build the patched llama.cpp that dflash-gguf drives.

Standard library only: this runs before the package and its dependencies are installed
(`python tools/build_native.py`), and again as `dflash-gguf build`.

Steps: download the pinned llama-cpp-python sdist (sha256 checked, cached), unpack its vendored
llama.cpp once (pristine), sync a patched copy of it (patches/*.patch in order, plus ggml-kernels/)
into a per-backend source tree touching only files whose content changes (so rebuilds stay
incremental), build the shared libraries with CMake and install them into a folder keyed by
(llama.cpp commit, hash of patches + kernels, backend).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..paths import cache_root, repo_root, sha256_file
from . import BACKENDS, cuda_toolchain

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
KERNELS_DIR_IN_TREE = "ggml-kernels"   # where ggml-kernels/ lands inside the llama.cpp tree
LIB_TARGETS = ["llama"]
TOOL_TARGETS = ["llama-server", "llama-speculative-simple", "llama-bench", "ggml-rpc-server"]


class BuildError(RuntimeError):
    """A build step failed; the message says which and what to do."""


@dataclass(frozen=True)
class SourceInputs:
    patches: list[Path]
    kernels: list[Path]
    kernels_root: Path | None

    def digest(self) -> str:
        h = hashlib.sha256()
        for p in self.patches:
            h.update(b"patch:" + p.name.encode() + b"\0" + p.read_bytes())
        for k in self.kernels:
            h.update(b"kernel:" + k.relative_to(self.kernels_root).as_posix().encode() + b"\0" + k.read_bytes())
        return h.hexdigest()[:16]


def source_inputs(root: Path | None = None) -> SourceInputs:
    root = root or repo_root()
    if root is None:
        raise BuildError("cannot find the dflash-gguf source checkout (patches/ and ggml-kernels/); "
                         "run the build from a clone of the repository")
    patches = sorted((root / "patches").glob("*.patch"))
    kroot = root / "ggml-kernels"
    # sources only: a documentation edit neither reaches the tree nor invalidates a build
    kernels = sorted(p for p in kroot.rglob("*") if p.is_file() and p.suffix != ".md") if kroot.is_dir() else []
    return SourceInputs(patches, kernels, kroot if kroot.is_dir() else None)


def build_key(inputs: SourceInputs, backend: str) -> str:
    recipe = hashlib.sha256(" ".join(cmake_args(backend, False, None)).encode()).hexdigest()[:4]
    return f"{LLAMA_CPP_COMMIT}-{inputs.digest()}{recipe}-{backend}"


def native_root() -> Path:
    return cache_root() / "native"


def lib_dir_for(key: str) -> Path:
    return native_root() / "lib" / key


def requested_backend() -> str | None:
    """The backend asked for with DFLASH_GGUF_BACKEND (set by `--backend` too), or None."""
    name = os.environ.get("DFLASH_GGUF_BACKEND", "").strip().lower()
    if not name:
        return None
    if name not in BACKENDS:
        raise BuildError(f"DFLASH_GGUF_BACKEND={name!r}: unknown backend; choose one of {', '.join(BACKENDS)}")
    return name


def default_backend() -> str:
    requested = requested_backend()
    if requested:
        return requested
    if sys.platform == "darwin":
        return "metal"
    if shutil.which("nvidia-smi"):   # no toolkit needed: a cuda build installs what it lacks (cuda_toolchain)
        probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if probe.returncode == 0 and "GPU" in probe.stdout:
            return "cuda"
    return "cpu"


VULKAN_PACKAGES_HINT = ("on Debian/Ubuntu: `apt-get install glslc libvulkan-dev spirv-headers` (plus a driver, e.g. "
                        "mesa-vulkan-drivers); elsewhere install the LunarG Vulkan SDK (https://vulkan.lunarg.com) or "
                        "your system's Vulkan headers + loader, shaderc (glslc) and SPIR-V headers")


def missing_vulkan_toolchain() -> list[str]:
    """What a Vulkan build lacks on this machine: ggml compiles its shaders with glslc and needs the Vulkan
    C++ headers, the loader library and the SPIR-V headers."""
    include_dirs = [Path(p) for p in os.environ.get("VULKAN_SDK", "").split(os.pathsep) if p]
    include_dirs = [d / "include" for d in include_dirs] + [Path("/usr/include"), Path("/usr/local/include"),
                                                            Path("/opt/homebrew/include")]
    has = lambda rel: any((d / rel).exists() for d in include_dirs)  # noqa: E731
    missing = []
    if not shutil.which("glslc"):
        missing.append("glslc (shaderc)")
    if not has("vulkan/vulkan.hpp"):
        missing.append("Vulkan headers (vulkan/vulkan.hpp)")
    if not has("spirv/unified1/spirv.hpp"):
        missing.append("SPIR-V headers (spirv/unified1/spirv.hpp)")
    if not _has_vulkan_loader():
        missing.append("the Vulkan loader library (libvulkan)")
    return missing


def _has_vulkan_loader() -> bool:
    import ctypes.util
    return ctypes.util.find_library("vulkan") is not None or ctypes.util.find_library("vulkan-1") is not None


def check_vulkan_toolchain() -> None:
    missing = missing_vulkan_toolchain()
    if missing:
        raise BuildError(f"the Vulkan build needs {', '.join(missing)}: not found; {VULKAN_PACKAGES_HINT}")


def _log(msg: str) -> None:
    print(f"[dflash-gguf build] {msg}", file=sys.stderr, flush=True)


def fetch_sdist() -> Path:
    """The pinned sdist from the package index, cached and sha256-checked."""
    dest_dir = native_root() / "downloads"
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / SDIST_NAME
    if dest.exists() and sha256_file(dest) == SDIST_SHA256:
        return dest
    _log(f"downloading {SDIST_NAME} from the package index")
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "-d", tmp, f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
        got = Path(tmp) / SDIST_NAME
        if subprocess.run(cmd, capture_output=True, text=True).returncode != 0 or not got.exists():
            _download_from_pypi_json(got)
        digest = sha256_file(got)
        if digest != SDIST_SHA256:
            raise BuildError(f"{SDIST_NAME}: sha256 {digest} does not match the pinned {SDIST_SHA256}; "
                             "the package index served a different file — refusing to build from it")
        os.replace(got, dest)
    return dest


def _download_from_pypi_json(dest: Path) -> None:
    url = f"https://pypi.org/pypi/llama-cpp-python/{LLAMA_CPP_PYTHON_VERSION}/json"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            meta = json.load(r)
        sdist = next(u for u in meta["urls"] if u["packagetype"] == "sdist")
        urllib.request.urlretrieve(sdist["url"], dest)
    except Exception as e:  # network errors of every kind end the build with one message
        raise BuildError(f"could not download llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({e}); "
                         f"put {SDIST_NAME} into {dest.parent.parent} by hand and run again") from e


def pristine_tree() -> Path:
    """The sdist unpacked once; never modified afterwards."""
    root = native_root() / f"sdist-{LLAMA_CPP_PYTHON_VERSION}"
    marker = root / ".unpacked"
    if marker.exists():
        return root
    sdist = fetch_sdist()
    _log(f"unpacking {sdist.name}")
    tmp = Path(tempfile.mkdtemp(dir=native_root(), prefix="unpack-"))
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        top = tmp / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
        gitlink = top / "vendor" / "llama.cpp" / ".git"
        if gitlink.is_file():  # a submodule pointer to a repository that is not in the sdist
            gitlink.unlink()
        if root.exists():
            shutil.rmtree(root)
        os.replace(top, root)
        marker.write_text(LLAMA_CPP_COMMIT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def patched_files(patch: Path) -> list[str]:
    """The tree paths one patch changes."""
    files = []
    for line in patch.read_text(errors="replace").splitlines():
        if line.startswith("+++ ") or line.startswith("--- "):
            name = line[4:].strip().split("\t")[0]
            if name != "/dev/null" and name[:2] in ("a/", "b/"):
                files.append(name[2:])
    return sorted(set(files))


def apply_patches(pristine: Path, patches: list[Path], out_dir: Path) -> dict[str, bytes | None]:
    """Apply patches in order to copies of the files they touch; return {path: new content or None}.

    A patch that does not apply stops everything with a message that names it.
    """
    touched = sorted({f for p in patches for f in patched_files(p)})
    for rel in touched:
        src = pristine / rel
        if src.exists():
            (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out_dir / rel)
    for p in patches:
        proc = subprocess.run(["git", "apply", "--whitespace=nowarn", str(p.resolve())], cwd=out_dir,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"patch {p.name} does not apply to llama.cpp {LLAMA_CPP_COMMIT}:\n"
                             f"{proc.stderr.strip()}\nfix or regenerate {p} against the pinned tree")
    return {rel: ((out_dir / rel).read_bytes() if (out_dir / rel).exists() else None) for rel in touched}


def sync_source_tree(inputs: SourceInputs, backend: str) -> Path:
    """Make the per-backend source tree equal pristine + patches + kernels, rewriting changed files only."""
    pristine = pristine_tree() / "vendor" / "llama.cpp"
    tree = native_root() / f"src-{backend}"
    state_file = native_root() / f"src-{backend}.state.json"
    if not (tree / "CMakeLists.txt").exists():
        _log(f"copying the pristine llama.cpp tree for backend {backend}")
        if tree.exists():
            shutil.rmtree(tree)
        shutil.copytree(pristine, tree, symlinks=True)
    previous = set(json.loads(state_file.read_text())) if state_file.exists() else set()

    with tempfile.TemporaryDirectory() as tmp:
        wanted = apply_patches(pristine, inputs.patches, Path(tmp))
    if inputs.kernels_root is not None:
        for k in inputs.kernels:
            wanted[f"{KERNELS_DIR_IN_TREE}/{k.relative_to(inputs.kernels_root).as_posix()}"] = k.read_bytes()
    for rel in previous - set(wanted):  # no longer patched: back to pristine
        src = pristine / rel
        wanted[rel] = src.read_bytes() if src.exists() else None

    changed = 0
    for rel, content in wanted.items():
        dst = tree / rel
        if content is None:
            if dst.exists():
                dst.unlink()
                changed += 1
            continue
        if dst.exists() and dst.read_bytes() == content:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(content)
        changed += 1
    state_file.write_text(json.dumps(sorted(r for r, c in wanted.items() if c is not None)))
    _log(f"source tree {tree}: {len(inputs.patches)} patches, {len(inputs.kernels)} kernel files, "
         f"{changed} files rewritten")
    return tree


def cmake_args(backend: str, tools: bool, cuda_arch: str | None) -> list[str]:
    # $ORIGIN rpath: the copied library folder is self-contained (libllama finds its libggml beside it)
    args = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
            "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=" + ("ON" if tools else "OFF"),
            "-DLLAMA_BUILD_TOOLS=" + ("ON" if tools else "OFF"),
            "-DLLAMA_BUILD_SERVER=" + ("ON" if tools else "OFF"),
            "-DLLAMA_BUILD_COMMON=" + ("ON" if tools else "OFF"),
            "-DGGML_NATIVE=" + os.environ.get("DFLASH_GGUF_NATIVE", "ON")]
    if tools:   # or the server's web UI is downloaded at build time (machines without network)
        args += ["-DLLAMA_USE_PREBUILT_UI=OFF"]
    if backend == "cuda":
        # NO_VMM: ggml-cuda then needs no libcuda at link or load time (cudart opens the driver itself), so the
        # build links without a driver and, on a machine whose driver is missing or too old, still loads and
        # runs on the CPU; VMM only changes how ggml's scratch pool grows (cudaMalloc'd chunks instead)
        args += ["-DGGML_CUDA=ON", "-DGGML_CUDA_NO_VMM=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch or 'native'}"]
    elif backend == "metal":
        args += ["-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"]
    elif backend == "vulkan":
        args += ["-DGGML_VULKAN=ON", "-DGGML_METAL=OFF"]
    else:
        args += ["-DGGML_METAL=OFF"]
    args += ["-DGGML_RPC=ON"]   # --rpc HOST:PORT works with every build (a small extra backend library)
    return args


def _run(cmd: list[str], what: str, todo: str) -> None:
    _log(f"{what}: {' '.join(cmd)}")
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (exit {proc.returncode}); the output above says why; {todo}")


def _failure_hint(backend: str, bdir: Path) -> str:
    what = {"cuda": "the CUDA toolkit line above shows which nvcc and cuBLAS it used "
                    f"({cuda_toolchain.TOOLKIT_ENV}=wheels takes all of it from the package index)",
            "vulkan": VULKAN_PACKAGES_HINT}.get(backend, "install what it names")
    return (f"{what}; then delete {bdir} and build again, or use `dflash-gguf build --backend cpu`"
            if backend != "cpu" else f"{what}, then delete {bdir} and build again")


def _backend_cmake_args(backend: str, cuda_arch: str | None) -> tuple[list[str], str | None]:
    """Toolchain arguments that depend on this machine (not part of the build key), and the CUDA architectures."""
    if backend != "cuda":
        return [], None
    try:
        arch = cuda_toolchain.choose_arch(cuda_arch)   # before any download or configure
        toolchain = cuda_toolchain.resolve()
    except cuda_toolchain.ToolchainError as e:
        raise BuildError(str(e)) from e
    _log(toolchain.describe())
    return toolchain.cmake_args(), arch


def _shared_libs(bin_dir: Path) -> list[Path]:
    pats = ("*.so", "*.so.*", "*.dylib", "*.dll", "*.metal")
    return sorted({p for pat in pats for p in bin_dir.glob(pat)})


def build(backend: str | None = None, jobs: int | None = None, tools: bool | list[str] = False,
          cuda_arch: str | None = None, root: Path | None = None) -> Path:
    """Build (or reuse) the patched libraries; return the folder to use as LLAMA_CPP_LIB_PATH.

    With tools=True also build upstream's llama-server / llama-speculative-simple / llama-bench /
    ggml-rpc-server (or the listed ones) from the same patched tree into <lib dir>/tools (the libraries there
    are not touched). They are built in the libraries' own build folder, so tools asked for after the
    libraries compile only their own objects (common/, tools/), not ggml again (ggml-cuda: half an hour on
    2 cores).
    """
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise BuildError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    inputs = source_inputs(root)
    key = build_key(inputs, backend)
    out = lib_dir_for(key)
    if backend == "vulkan" and not (out / "build.json").exists():
        check_vulkan_toolchain()
    wanted = TOOL_TARGETS if tools is True else list(tools or [])
    if not (out / "build.json").exists():
        # libraries and tools from one CMake build: compiling ggml (ggml-cuda: minutes) once instead of twice
        _build_libs(inputs, key, backend, jobs, cuda_arch, out, wanted)
    missing = [t for t in wanted if not (out / "tools" / t).exists()]
    if missing:
        _build_tools(inputs, backend, jobs, cuda_arch, out, missing)
    _log(f"up to date: {out}")
    return out


def configure(inputs: SourceInputs, backend: str, cuda_arch: str | None, tools: bool, bdir: Path) -> None:
    """CMake configure of the patched tree into bdir; for CUDA the architectures and toolkit are settled first,
    so a missing --cuda-arch or toolkit stops the build before anything is copied or configured."""
    extra, cuda_arch = _backend_cmake_args(backend, cuda_arch)
    tree = sync_source_tree(inputs, backend)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(tree), "-B", str(bdir), *gen, *cmake_args(backend, tools, cuda_arch), *extra],
         "configure", _failure_hint(backend, bdir))


def build_dir(backend: str) -> Path:
    """The one CMake build folder of a backend, for its libraries and its tools alike."""
    return native_root() / f"build-{backend}"


def _cmake_build(inputs: SourceInputs, backend: str, jobs: int | None, cuda_arch: str | None, tools: bool,
                 targets: list[str]) -> Path:
    bdir = build_dir(backend)
    configure(inputs, backend, cuda_arch, tools, bdir)
    _run(["cmake", "--build", str(bdir), "-j", str(jobs or os.cpu_count() or 2), "--target", *targets], "build",
         _failure_hint(backend, bdir))
    return bdir / "bin"


def _build_info(inputs: SourceInputs, key: str, backend: str, seconds: float) -> dict:
    return {"key": key, "backend": backend, "llama_cpp_commit": LLAMA_CPP_COMMIT,
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "patches": [p.name for p in inputs.patches],
            "kernels": [k.relative_to(inputs.kernels_root).as_posix() for k in inputs.kernels],
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 1),
            "machine": platform.machine(), "system": platform.system()}


def _install_dir(files: list[Path], dest: Path, info: dict) -> None:
    """Copy files into dest atomically (temp folder + rename), with build.json written last."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, tmp / f.name, follow_symlinks=True)
    (tmp / "build.json").write_text(json.dumps(info, indent=2))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def _build_libs(inputs: SourceInputs, key: str, backend: str, jobs, cuda_arch, out: Path,
                tools: list[str] = ()) -> None:
    t0 = time.time()
    bin_dir = _cmake_build(inputs, backend, jobs, cuda_arch, bool(tools), LIB_TARGETS + list(tools))
    _install_dir(_shared_libs(bin_dir), out, _build_info(inputs, key, backend, time.time() - t0))
    if tools:
        _install_tools(inputs, backend, bin_dir, out, list(tools), time.time() - t0)
    (native_root() / "current").write_text(str(out))
    for old in out.parent.glob(f"*-{backend}"):   # builds of earlier patch sets are stale for good
        if old != out:
            shutil.rmtree(old, ignore_errors=True)
    _log(f"built {backend} libraries in {time.time() - t0:.0f} s -> {out}")


def _build_tools(inputs: SourceInputs, backend: str, jobs, cuda_arch, out: Path, targets: list[str]) -> None:
    t0 = time.time()
    bin_dir = _cmake_build(inputs, backend, jobs, cuda_arch, True, targets)
    _install_tools(inputs, backend, bin_dir, out, targets, time.time() - t0)


def _install_tools(inputs: SourceInputs, backend: str, bin_dir: Path, out: Path, targets: list[str],
                   seconds: float) -> None:
    """The tools just built, beside the libraries of that build (their rpath is $ORIGIN), into out/tools, keeping
    the tools installed there before. Only the targets of this build: the shared build folder may hold a tool
    built earlier from other sources."""
    dest = out / "tools"
    kept = [dest / t for t in TOOL_TARGETS if t not in targets and (dest / t).is_file()]
    exes = [bin_dir / t for t in targets] + kept
    built = sorted(e.name for e in exes)
    info = _build_info(inputs, out.name, backend, seconds) | {"tools": built}
    _install_dir(_shared_libs(bin_dir) + exes, dest, info)
    _log(f"built tools {', '.join(targets)} in {seconds:.0f} s -> {dest} (installed: {', '.join(built)})")


def tool_path(name: str, backend: str | None = None) -> Path:
    """Path of an upstream tool built from our tree, building it (alone) when missing."""
    out = build(backend, tools=[name])
    return out / "tools" / name


def bindings_version() -> tuple[str | None, Path | None]:
    """(version, package folder) of the llama_cpp package Python would import, read without importing it
    (the import loads a native library); (None, None) when there is none."""
    import importlib.util  # noqa: PLC0415
    import re  # noqa: PLC0415
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None, None
    found = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", Path(spec.origin).read_text(errors="replace"), re.M)
    return (found.group(1) if found else "unknown"), Path(spec.origin).parent


def install_python_bindings() -> None:
    """Install llama-cpp-python's Python package from the same sdist, without its native build."""
    if bindings_version()[0] == LLAMA_CPP_PYTHON_VERSION:
        return
    env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
    _log("installing the llama-cpp-python bindings (no native build)")
    cmd = [sys.executable, "-m", "pip", "install", "-q", str(fetch_sdist())]
    if subprocess.run(cmd, env=env).returncode != 0:
        raise BuildError("pip could not install llama-cpp-python's Python package; see the output above")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="build_native", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=BACKENDS, default=None,
                    help="default: $DFLASH_GGUF_BACKEND, else detected (cuda/metal/cpu)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--tools", action="store_true", help="also build llama-server, llama-speculative-simple, ...")
    ap.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES: 86 RTX 30, 89 RTX 40, 120 RTX 50, "
                    "90 H100 (default: $DFLASH_GGUF_CUDA_ARCH, else the visible GPUs')")
    ap.add_argument("--install-bindings", action="store_true",
                    help="also pip-install llama-cpp-python's Python package without its native build")
    a = ap.parse_args(argv)
    try:
        if a.install_bindings:
            install_python_bindings()
        out = build(a.backend, a.jobs, a.tools, a.cuda_arch)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0
