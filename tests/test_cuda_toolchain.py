"""`--backend cuda` without a system toolkit: which parts come from where, the merged toolkit root, the
architecture asked for before anything is configured, the driver message at load, and (for real, with the
wheels from the package index) that CMake configures the CUDA build with that toolkit. Compiling CUDA is
left out of the suite (25 min on 2 cores); tools/gpu/README.md has the compile and its measurements."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from dflash_gguf.native import build as nb
from dflash_gguf.native import cuda_toolchain as ct
from dflash_gguf.native.cuda_status import explain

SYSTEM_FILES = ("bin/nvcc", "bin/nvcc.profile", "nvvm/libdevice/libdevice.10.bc", "include/crt/host_config.h",
                "include/cccl/cuda/std/version", "include/cuda_runtime.h", "lib64/libcudart.so.13")
CUBLAS_FILES = ("include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13")


def _tree(root, files):
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A system toolkit without cuBLAS (the image's nvcc 13), no installed NVIDIA wheels, a private cache, and
    'downloads' that unpack a fake cuBLAS wheel tree while recording what was asked for."""
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ct.TOOLKIT_ENV, raising=False)
    system = _tree(tmp_path / "cuda-13.0", SYSTEM_FILES)
    monkeypatch.setattr(ct, "system_toolkit", lambda: system)
    monkeypatch.setattr(ct, "nvcc_major", lambda nvcc: 13)
    monkeypatch.setattr(ct, "installed_wheel_tree", lambda: None)
    asked: list[str] = []

    def install(wheels):
        asked.extend(w.requirement for w in wheels)
        prefix = tmp_path / "prefix"
        files = [f for w in wheels for f in {"cublas": CUBLAS_FILES}.get(w.part, SYSTEM_FILES)]
        _tree(prefix / ct.WHEEL_TREE, files)
        return prefix
    monkeypatch.setattr(ct, "install_wheels", install)
    return system, asked


def test_missing_cublas_comes_from_the_wheel_and_merges_into_one_toolkit(fake):
    system, asked = fake
    tc = ct.resolve()
    assert asked == ["nvidia-cublas==13.0.2.14"] and tc.origin == "system + wheels"
    assert ct.parts_present(tc.root) == set(ct.PARTS)
    # nvcc finds its includes and libraries relative to the path it was called by (nvcc.profile's TOP)
    assert tc.nvcc == tc.root / "bin" / "nvcc" and (tc.nvcc.resolve() == system / "bin" / "nvcc")
    target = tc.root / "targets" / "x86_64-linux"
    assert (target / "include" / "cublas_v2.h").is_file() and (target / "lib64" / "libcudart.so.13").is_file()
    for name, versioned in ct.LINK_NAMES.items():       # what the linker asks for: -lcublas -> libcublas.so
        assert (tc.lib_dir / name).resolve().name == versioned
    args = tc.cmake_args()
    assert f"-DCUDAToolkit_ROOT={tc.root}" in args and f"-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath,{tc.lib_dir}" in args
    assert ct.resolve().root == tc.root                     # settled: the same root, not rebuilt


def test_a_complete_system_toolkit_is_used_as_it_is(fake):
    system, asked = fake
    _tree(system, [f.replace("lib/", "lib64/") for f in CUBLAS_FILES])
    tc = ct.resolve()
    assert (tc.root, tc.origin, tc.lib_dir, asked) == (system, "system", system / "lib64", [])


def test_a_toolkit_of_another_major_is_not_mixed_with_cuda_13_wheels(fake, monkeypatch):
    system, asked = fake
    monkeypatch.setattr(ct, "nvcc_major", lambda nvcc: 12)
    tc = ct.resolve()
    assert asked == [w.requirement for w in ct.WHEELS] and tc.origin == "wheels"
    assert not tc.nvcc.resolve().is_relative_to(system)


def test_wheels_mode_ignores_the_system_toolkit_and_a_partial_root_is_refused(fake, monkeypatch, tmp_path):
    _, asked = fake
    monkeypatch.setenv(ct.TOOLKIT_ENV, "wheels")
    assert ct.resolve().origin == "wheels" and asked == [w.requirement for w in ct.WHEELS]
    monkeypatch.setenv(ct.TOOLKIT_ENV, str(tmp_path / "cuda-13.0"))
    with pytest.raises(ct.ToolchainError, match="lacks cublas"):
        ct.resolve()


def test_every_wheel_is_pinned_with_its_sha256():
    assert {w.part for w in ct.WHEELS} == set(ct.PARTS)
    for w in ct.WHEELS:
        assert re.fullmatch(r"[0-9a-f]{64}", w.sha256) and re.fullmatch(r"\d+(\.\d+)+", w.version), w
        assert w.name.startswith("nvidia-") and w.version.startswith(f"{ct.CUDA_MAJOR}.")


def test_no_gpu_and_no_arch_stops_before_anything_is_configured(monkeypatch):
    monkeypatch.delenv(ct.ARCH_ENV, raising=False)
    monkeypatch.setattr(ct, "visible_gpu_archs", lambda: [])
    monkeypatch.setattr(ct, "resolve", lambda: pytest.fail("resolved the toolkit before choosing the arch"))
    monkeypatch.setattr(nb, "sync_source_tree", lambda *a: pytest.fail("copied the source before choosing the arch"))
    with pytest.raises(nb.BuildError) as e:
        nb.configure(nb.source_inputs(), "cuda", None, False, nb.native_root() / "never")
    assert "--cuda-arch" in str(e.value) and all(f"{a} " in str(e.value) for a in ("86", "89", "120", "90"))
    monkeypatch.setattr(ct, "visible_gpu_archs", lambda: ["86", "89"])
    assert ct.choose_arch(None) == "86;89"
    monkeypatch.setenv(ct.ARCH_ENV, "120")
    assert ct.choose_arch(None) == "120" and ct.choose_arch("90") == "90"
    with pytest.raises(ct.ToolchainError, match="not a CUDA architecture"):
        ct.choose_arch("sm_90")


def test_a_driver_older_than_the_runtime_is_one_line_that_says_what_to_do():
    log = ["ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime "
           "version\n"]
    line = explain(["load_backend: something else\n", *log])
    assert "\n" not in line and "driver" in line and "--backend cpu" in line and "insufficient" in line
    assert explain(["ggml_cuda_init: found 1 CUDA devices\n"]) is None


@pytest.fixture
def wheel_toolkit(monkeypatch):
    """The toolkit made of the pinned wheels alone (downloaded once into the user cache, ~525 MB)."""
    monkeypatch.setenv(ct.TOOLKIT_ENV, "wheels")
    try:
        return ct.resolve()
    except ct.ToolchainError as e:
        if "could not download" in str(e) and not ct.system_toolkit():
            pytest.skip(f"no CUDA toolkit here and the package index is unreachable: {e}")
        raise


def test_the_wheel_toolkit_configures_the_cuda_build(tmp_path, wheel_toolkit):
    """The real thing, without a GPU and without the system's toolkit: every part from the pinned wheels (downloaded
    once into the user cache), merged, and CMake configures ggml-cuda for sm_90 with it."""
    tc = wheel_toolkit
    assert tc.origin == "wheels" and ct.parts_present(tc.root) == set(ct.PARTS)
    version = subprocess.run([str(tc.nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    assert f"release {ct.CUDA_MAJOR}.0" in version
    bdir = tmp_path / "configure"
    nb.configure(nb.source_inputs(), "cuda", "90", False, bdir)
    cache = (bdir / "CMakeCache.txt").read_text()
    assert re.search(rf"CMAKE_CUDA_COMPILER:\w+={re.escape(str(tc.nvcc))}\n", cache)
    assert "GGML_CUDA_NO_VMM:BOOL=ON" in cache and re.search(r"CMAKE_CUDA_ARCHITECTURES:\w+=90\n", cache)
    assert f"CUDA_cublas_LIBRARY:FILEPATH={tc.lib_dir}/libcublas.so\n" in cache


PROBE_CU = r"""
#include <cstdio>
#include <cublas_v2.h>
#include <cuda_runtime.h>
__global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }
int main() {
    int runtime = 0, cublas_major = 0, devices = 0;
    cudaRuntimeGetVersion(&runtime);
    cublasGetProperty(MAJOR_VERSION, &cublas_major);
    cudaError_t err = cudaGetDeviceCount(&devices);
    printf("runtime %d cublas %d devices %d: %s\n", runtime, cublas_major, err == cudaSuccess ? devices : 0,
           cudaGetErrorString(err));
    return 0;
}
"""


def test_the_wheel_toolkit_compiles_for_sm90_and_links_cudart_and_cublas_by_rpath(tmp_path, wheel_toolkit):
    """nvcc, its headers, cudart and cuBLAS from the wheels compile a kernel for sm_90 and link a program that
    loads both libraries through the rpath the build uses, with no LD_LIBRARY_PATH (no GPU needed to run it)."""
    tc = wheel_toolkit
    (tmp_path / "probe.cu").write_text(PROBE_CU)
    subprocess.run([str(tc.nvcc), "-arch=sm_90", str(tmp_path / "probe.cu"), "-o", str(tmp_path / "probe"),
                    "-lcublas", "-Xlinker", f"-rpath={tc.lib_dir}"], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, env=env, check=True).stdout
    assert re.match(rf"runtime {ct.CUDA_MAJOR}0\d\d cublas {ct.CUDA_MAJOR} devices \d+: ", out), out
    print(out)     # on a machine without a driver: "... devices 0: CUDA driver version is insufficient ..."
