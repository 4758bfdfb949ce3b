"""What `dflash-gguf doctor` reports about the native layer."""

from __future__ import annotations

import ctypes
import json

from . import build as _build
from .lib import NativeLibraryError, load
from .offload import DEVICE_TYPES


def _devices(native) -> list[dict]:
    g = native.ggml
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append({"name": g.ggml_backend_dev_name(dev).decode(), "description": g.ggml_backend_dev_description(dev).decode(),
                    "type": DEVICE_TYPES.get(g.ggml_backend_dev_type(dev), "?"),
                    "memory_free_mib": free.value >> 20, "memory_total_mib": total.value >> 20})
    return out


VULKAN_CPU_DEVICES_HINT = ("ggml's Vulkan backend sees no GPU; CPU-type Vulkan devices (e.g. Mesa's llvmpipe) are "
                           "hidden unless GGML_VK_VISIBLE_DEVICES lists them (GGML_VK_VISIBLE_DEVICES=0), and they "
                           "are far slower than the CPU backend")


def _tools(lib_dir) -> list[str]:
    stamp = lib_dir / "tools" / "build.json"
    return json.loads(stamp.read_text()).get("tools", []) if stamp.exists() else []


def collect() -> dict:
    report: dict = {"llama_cpp_commit": _build.LLAMA_CPP_COMMIT,
                    "llama_cpp_python": _build.LLAMA_CPP_PYTHON_VERSION,
                    "default_backend": _build.default_backend()}
    try:
        inputs = _build.source_inputs()
        report["patches"] = [p.name for p in inputs.patches]
    except _build.BuildError:
        pass
    try:
        native = load()
    except NativeLibraryError as e:
        report.update(ok=False, error=str(e))
        return report
    L = native.llama_cpp
    report.update(
        ok=True,
        lib_dir=str(native.lib_dir),
        build_key=native.info.get("key"),
        built_backend=native.info.get("backend"),
        applied_patches=native.info.get("patches"),
        kernels=native.info.get("kernels"),
        tools_built=_tools(native.lib_dir),
        tap_api_version=native.dflash.api_version(),
        gpu_offload=bool(L.llama_supports_gpu_offload()),
        rpc=bool(L.llama_supports_rpc()),
        devices=_devices(native),
        system_info=L.llama_print_system_info().decode().strip(),
    )
    if native.notice:
        report["hint"] = native.notice
    if native.info.get("backend") == "vulkan" and not any(d["name"].startswith("Vulkan") for d in report["devices"]):
        report["hint"] = VULKAN_CPU_DEVICES_HINT
    return report
