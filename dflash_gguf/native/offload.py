"""Tensor placement through llama.cpp's own mechanisms: buffer-type overrides, MoE-expert rules, RPC.

`tensor_buft_overrides` is a NULL-terminated array of {const char *pattern; buft}; llama-cpp-python
types the field as void*, so the array is built here and must be kept alive with the model params.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

from ..errors import UserError

# llama.cpp's LLM_FFN_EXPS_REGEX (common/common.h): routed-expert FFN tensors
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


class OffloadError(UserError):
    """A placement rule names a device or pattern that cannot work."""


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def buffer_types(native) -> dict[str, int]:
    """Name → ggml_backend_buffer_type_t of every device's default buffer type ("CPU", "CUDA0", ...)."""
    g = native.ggml
    out = {}
    for i in range(g.ggml_backend_dev_count()):
        buft = g.ggml_backend_dev_buffer_type(g.ggml_backend_dev_get(i))
        if buft:
            out[g.ggml_backend_buft_name(buft).decode()] = buft
    return out


def gpu_free_bytes(native) -> list[int]:
    """Free memory of every GPU device (discrete or integrated), in device order; [] on a CPU-only build."""
    g = native.ggml
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        if g.ggml_backend_dev_type(dev) in (1, 2):    # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            out.append(free.value)
    return out


DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}


SOFTWARE_DEVICES = ("llvmpipe", "SwiftShader")     # Vulkan devices that run on the CPU


def software_gpus(native) -> list[str]:
    """Descriptions of the GPU-type devices that are CPU emulations (Mesa's lavapipe): their timings are not GPU
    timings."""
    g = native.ggml
    devs = [g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count())]
    return [d for d in (g.ggml_backend_dev_description(x).decode() for x in devs if g.ggml_backend_dev_type(x) in (1, 2))
            if any(s in d for s in SOFTWARE_DEVICES)]


def device_names(native) -> list[str]:
    g = native.ggml
    return [g.ggml_backend_dev_name(g.ggml_backend_dev_get(i)).decode() for i in range(g.ggml_backend_dev_count())]


def device_array(native, names: Sequence[str]) -> ctypes.Array:
    """NULL-terminated `ggml_backend_dev_t` list for `llama_model_params.devices` from device names, as
    llama.cpp's --device takes them ("Vulkan0,Vulkan1"; "none": no device, every layer on the CPU)."""
    g = native.ggml
    wanted = [] if list(names) == ["none"] else list(names)
    devices = []
    for name in wanted:
        dev = g.ggml_backend_dev_by_name(name.encode())
        if not dev:
            raise OffloadError(f"--device {name}: no such device in this build; it has: "
                               f"{', '.join(device_names(native)) or 'none'} (or 'none' for the CPU only)")
        if g.ggml_backend_dev_type(dev) == 0:
            raise OffloadError(f"--device {name}: a CPU device; layers that are not offloaded already run on the "
                               "CPU (use --device none to offload nothing)")
        devices.append(dev)
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def parse_override(spec: str) -> tuple[str, str]:
    """'REGEX=BUFT' → (regex, buft name)."""
    pattern, sep, buft = spec.rpartition("=")
    if not sep or not pattern or not buft:
        raise OffloadError(f"--override-tensor {spec!r}: expected REGEX=BUFFER_TYPE, e.g. 'ffn_.*_exps=CPU'")
    return pattern, buft


def moe_overrides(n_cpu_moe: int = 0, cpu_moe: bool = False) -> list[str]:
    """The same rules as llama.cpp's --cpu-moe / --n-cpu-moe N: experts of all / the first N layers on CPU."""
    if cpu_moe:
        return [f"{FFN_EXPS_REGEX}=CPU"]
    return [rf"blk\.{i}{FFN_EXPS_REGEX}=CPU" for i in range(n_cpu_moe)]


def build_override_array(native, overrides: Sequence) -> ctypes.Array:
    """NULL-terminated `llama_model_tensor_buft_override` array; keep the result alive."""
    known = buffer_types(native)
    arr = (_BuftOverride * (len(overrides) + 1))()
    for i, o in enumerate(overrides):
        buft = known.get(o.buffer_type)
        if buft is None:
            raise OffloadError(f"override {o.pattern}={o.buffer_type}: unknown buffer type '{o.buffer_type}'; "
                               f"this build has: {', '.join(known) or 'none'}")
        arr[i].pattern = o.pattern.encode()
        arr[i].buft = buft
    arr[len(overrides)].pattern = None
    arr[len(overrides)].buft = None
    return arr


def add_rpc_servers(native, servers: str) -> ctypes.Array:
    """Register `HOST:PORT,...` rpc-servers as ggml devices, as llama.cpp's --rpc does (needs GGML_RPC=ON).

    Returns the NULL-terminated device list for `llama_model_params.devices`: the RPC devices first
    (fewest network transfers, llama.cpp's order), then the local GPUs. Keep it alive with the params.
    """
    g = native.ggml
    reg = g.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise OffloadError("--rpc needs an RPC-enabled build: DFLASH_GGUF_RPC=1 dflash-gguf build")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
    devices = []
    for endpoint in [s.strip() for s in servers.split(",") if s.strip()]:
        server_reg = add_server(endpoint.encode())
        if not server_reg:
            raise OffloadError(f"--rpc {endpoint}: could not reach the rpc-server")
        devices += [g.ggml_backend_reg_dev_get(server_reg, i) for i in range(g.ggml_backend_reg_dev_count(server_reg))]
    local = [g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count())]
    devices += [d for d in local if g.ggml_backend_dev_type(d) in (1, 2) and d not in devices]
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
