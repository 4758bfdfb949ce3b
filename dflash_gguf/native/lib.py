"""Find the patched libraries, point llama-cpp-python at them, and bind our C API.

Loading is lazy: nothing here runs at import of `dflash_gguf`, so `--help` and `convert` work
without a native build. `load()` is the single entry point; it returns the `llama_cpp` module
and our bindings, or raises `NativeLibraryError` with a message that says how to build.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from . import build as _build
from .cuda_status import explain as explain_cuda_start

EXPECTED_API_VERSION = 3
BUILD_HINT = "build it with `dflash-gguf build` (or `python tools/build_native.py`)"


class NativeLibraryError(RuntimeError):
    """The patched llama.cpp libraries are missing, stale or incomplete."""


@dataclass(frozen=True)
class NativeLibrary:
    lib_dir: Path
    info: dict
    llama_cpp: ModuleType          # llama-cpp-python's low-level bindings (loaded from lib_dir)
    dflash: "DFlashAPI"            # our extern "C" API
    ggml_base: ctypes.CDLL         # tensors, buffer types
    ggml: ctypes.CDLL              # backend/device registry
    notice: str | None = None      # why a GPU build offers no device (e.g. a driver older than the CUDA runtime)


_loaded: NativeLibrary | None = None


def _candidate_dirs() -> list[Path]:
    """Where to look, most specific first."""
    env = os.environ.get("DFLASH_GGUF_LIB_DIR")
    if env:
        return [Path(env)]
    try:
        inputs = _build.source_inputs()
    except _build.BuildError:
        inputs = None
    requested = _build.requested_backend()
    if inputs is None:  # installed without the source checkout: take the last build
        current = _build.native_root() / "current"
        return [Path(current.read_text().strip())] if current.exists() and not requested else []
    order = [requested] if requested else [_build.default_backend(), "cpu", "cuda", "vulkan", "metal"]
    return list(dict.fromkeys(_build.lib_dir_for(_build.build_key(inputs, b)) for b in order))


def find_lib_dir() -> Path:
    try:
        candidates = _candidate_dirs()
    except _build.BuildError as e:
        raise NativeLibraryError(str(e)) from e
    for d in candidates:
        if (d / "build.json").exists():
            return d
    requested = _build.requested_backend()
    if requested:
        raise NativeLibraryError(f"the {requested} build of the patched llama.cpp is not built yet (or stale); "
                                 f"build it with `dflash-gguf build --backend {requested}`")
    built = sorted((_build.native_root() / "lib").glob("*/build.json")) if (_build.native_root() / "lib").exists() else []
    if built:
        raise NativeLibraryError(
            "the patched llama.cpp libraries are stale: patches/ or ggml-kernels/ changed since the last build "
            f"(found {', '.join(p.parent.name for p in built)}); {BUILD_HINT}")
    raise NativeLibraryError(f"the patched llama.cpp libraries are not built yet; {BUILD_HINT}")


class DFlashAPI:
    """ctypes bindings of include/llama-dflash.h (patches/0001)."""

    _SIGNATURES = {
        "llama_dflash_api_version": ([], ctypes.c_int32),
        "llama_dflash_set_layer_taps": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32],
                                        ctypes.c_int32),
        "llama_dflash_n_layer_taps": ([ctypes.c_void_p], ctypes.c_int32),
        "llama_dflash_n_rows_last": ([ctypes.c_void_p], ctypes.c_int32),
        # out (float *) as a plain address: the loop reads one row per plain step, and building a
        # ctypes pointer object for it cost more than the copy
        "llama_dflash_get_layer_taps": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p],
                                        ctypes.c_int32),
        "llama_dflash_model_target_layer_ids": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32],
                                                ctypes.c_int32),
        "llama_dflash_model_block_size": ([ctypes.c_void_p], ctypes.c_int32),
        "llama_dflash_model_mask_token": ([ctypes.c_void_p], ctypes.c_int32),
        "llama_dflash_set_markov_head_in_graph": ([ctypes.c_void_p, ctypes.c_bool], ctypes.c_int32),
        "llama_dflash_model_draft_vocab": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32], ctypes.c_int32),
        "llama_dflash_set_draft_vocab_logits": ([ctypes.c_void_p, ctypes.c_bool], ctypes.c_int32),
    }

    # llama-ext.h staging API of the pinned tree, C++ linkage: the DFlash2 selector lattice and the DSpark
    # confidences come out of the dflash graph as "nextn" rows. Bound by their Itanium-mangled names
    # (Linux, macOS); where a build lacks them, `nextn` is None and only DFlash2 drafting is unavailable.
    _NEXTN = {
        "set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                                 [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
        "get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context",
                                 [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)),
    }

    def __init__(self, lib: ctypes.CDLL, lib_path: Path):
        self.nextn = None
        if all(hasattr(lib, mangled) for mangled, _, _ in self._NEXTN.values()):
            self.nextn = types.SimpleNamespace()
            for name, (mangled, argtypes, restype) in self._NEXTN.items():
                fn = getattr(lib, mangled)
                fn.argtypes, fn.restype = argtypes, restype
                setattr(self.nextn, name, fn)
        missing = [name for name in self._SIGNATURES if not hasattr(lib, name)]
        if missing:
            raise NativeLibraryError(f"{lib_path} lacks the dflash tap API ({', '.join(missing)}): it was built "
                                     f"without patches/0001; {BUILD_HINT}")
        for name, (argtypes, restype) in self._SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
            setattr(self, name.removeprefix("llama_dflash_"), fn)
        version = self.api_version()
        if version != EXPECTED_API_VERSION:
            raise NativeLibraryError(f"{lib_path}: dflash API version {version}, this package needs "
                                     f"{EXPECTED_API_VERSION}; {BUILD_HINT}")


_P, _S, _C = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
# libggml's device/backend registry, bound once (ctypes' int default would truncate pointers)
_GGML_SIGNATURES = {
    "ggml_backend_dev_count": ([], _S),
    "ggml_backend_dev_get": ([_S], _P),
    "ggml_backend_dev_by_name": ([_C], _P),
    "ggml_backend_dev_name": ([_P], _C),
    "ggml_backend_dev_description": ([_P], _C),
    "ggml_backend_dev_type": ([_P], ctypes.c_int),
    "ggml_backend_dev_memory": ([_P, ctypes.POINTER(_S), ctypes.POINTER(_S)], None),
    "ggml_backend_dev_buffer_type": ([_P], _P),
    "ggml_backend_buft_name": ([_P], _C),
    "ggml_backend_reg_by_name": ([_C], _P),
    "ggml_backend_reg_get_proc_address": ([_P, _C], _P),
    "ggml_backend_reg_dev_count": ([_P], _S),
    "ggml_backend_reg_dev_get": ([_P, _S], _P),
}


def bind(lib: ctypes.CDLL, signatures: dict) -> ctypes.CDLL:
    """Sets argtypes/restype of every function in `signatures` ({name: (argtypes, restype)})."""
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def libname(base: str) -> str:
    return {"darwin": f"lib{base}.dylib", "win32": f"{base}.dll"}.get(sys.platform, f"lib{base}.so")


_LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4}


_log_captures: list[list[str]] = []
_log_holds: list[list[str]] = []


@contextlib.contextmanager
def capture_log():
    """Collect every llama.cpp log line (all levels) emitted inside the block, e.g. loader decisions."""
    lines: list[str] = []
    _log_captures.append(lines)
    try:
        yield lines
    finally:
        _log_captures.remove(lines)


@contextlib.contextmanager
def held_log():
    """Hold back the llama.cpp log lines that would be printed inside the block: the caller folds them into
    its own one-line error, or prints them (`sys.stderr.write("".join(lines))`) when all went well."""
    lines: list[str] = []
    _log_holds.append(lines)
    try:
        yield lines
    finally:
        _log_holds.remove(lines)


def _install_logger(llama_cpp: ModuleType) -> None:
    """Route llama.cpp's log through a level filter: errors only, unless DFLASH_GGUF_LOG says otherwise."""
    threshold = _LOG_LEVELS.get(os.environ.get("DFLASH_GGUF_LOG", "error").lower(), 4)
    last_level = [4]

    @llama_cpp.llama_log_callback
    def _log(level, text, _user):
        if level != 5:  # 5 = GGML_LOG_LEVEL_CONT continues the previous message
            last_level[0] = level
        message = text.decode("utf-8", "replace")
        for sink in _log_captures:
            sink.append(message)
        if last_level[0] >= threshold:
            if _log_holds:
                _log_holds[-1].append(message)
            else:
                sys.stderr.write(message)

    _install_logger.callback = _log  # keep the ctypes callback alive
    llama_cpp.llama_log_set(_log, None)


def select_backend(name: str | None) -> None:
    """Ask for the build of one backend (`--backend`) before the library loads; a no-op for None."""
    if not name:
        return
    name = name.strip().lower()
    if name not in _build.BACKENDS:
        raise NativeLibraryError(f"--backend {name}: unknown backend; choose one of {', '.join(_build.BACKENDS)}")
    if _loaded is not None and _loaded.info.get("backend") != name:
        raise NativeLibraryError(f"--backend {name}: this process already loaded the {_loaded.info.get('backend')} "
                                 "build; one backend per process")
    os.environ["DFLASH_GGUF_BACKEND"] = name


def check_bindings_version() -> None:
    """llama-cpp-python's ctypes structures must be the pinned release's: another release lays out
    llama_model_params / llama_context_params differently, and our library would crash on the first load."""
    version, where = _build.bindings_version()
    if version is not None and version != _build.LLAMA_CPP_PYTHON_VERSION:
        raise NativeLibraryError(
            f"llama_cpp {version} ({where}) is the llama-cpp-python Python would import, but the patched library "
            f"is built from llama-cpp-python {_build.LLAMA_CPP_PYTHON_VERSION}: their C structures differ and "
            f"loading a model would crash. Install the matching bindings: `pip install "
            f"llama-cpp-python=={_build.LLAMA_CPP_PYTHON_VERSION}` (or `python tools/build_native.py "
            "--install-bindings`), or use a virtual environment without the other release")


def load() -> NativeLibrary:
    global _loaded
    if _loaded is not None:
        return _loaded
    lib_dir = find_lib_dir()
    current = os.environ.get("LLAMA_CPP_LIB_PATH")
    if "llama_cpp" in sys.modules and current and Path(current) != lib_dir:
        raise NativeLibraryError(f"llama_cpp was already imported from {current}, not from {lib_dir}")
    check_bindings_version()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    try:
        import llama_cpp  # noqa: PLC0415 - must follow LLAMA_CPP_LIB_PATH
    except ImportError as e:
        raise NativeLibraryError(f"cannot import llama_cpp ({e}); install the bindings with "
                                 "`python tools/build_native.py --install-bindings`") from e
    except (OSError, AttributeError, FileNotFoundError) as e:
        raise NativeLibraryError(f"llama_cpp could not load {lib_dir} ({e}); {BUILD_HINT}") from e
    libllama = llama_cpp.llama_cpp._lib
    dflash = DFlashAPI(libllama, lib_dir / libname("llama"))
    ggml_base = ctypes.CDLL(str(lib_dir / libname("ggml-base")))
    _install_logger(llama_cpp)
    ggml = bind(ctypes.CDLL(str(lib_dir / libname("ggml"))), _GGML_SIGNATURES)
    with held_log() as start_log:    # the backends start (CUDA: find the driver and devices) on first use
        llama_cpp.llama_backend_init()
        ggml.ggml_backend_dev_count()
    notice = explain_cuda_start(start_log)
    sys.stderr.write(f"dflash-gguf: {notice}\n" if notice else "".join(start_log))
    info = json.loads((lib_dir / "build.json").read_text())
    _loaded = NativeLibrary(lib_dir, info, llama_cpp, dflash, ggml_base, ggml, notice)
    return _loaded
