"""The native build recipe: patches apply to a fresh unpack, failures name the patch, keys track inputs."""

from pathlib import Path

import pytest

from dflash_gguf.native import build as nb

ROOT = Path(__file__).resolve().parent.parent


def test_patches_apply_to_fresh_unpack(tmp_path):
    inputs = nb.source_inputs(ROOT)
    assert [p.name[:4] for p in inputs.patches] == sorted(p.name[:4] for p in inputs.patches)
    assert len(inputs.patches) >= 2
    pristine = nb.pristine_tree() / "vendor" / "llama.cpp"
    files = nb.apply_patches(pristine, inputs.patches, tmp_path)
    header = files["include/llama-dflash.h"].decode()
    assert 'extern "C"' in header and "llama_dflash_get_layer_taps" in header
    for arch in ("qwen2", "gemma3", "phi3"):
        assert b"res->t_layer_inp[il] = inpL;" in files[f"src/models/{arch}.cpp"], arch
        assert b"res->t_layer_inp[il] = inpL;" not in (pristine / f"src/models/{arch}.cpp").read_bytes(), arch


def test_broken_patch_is_named(tmp_path):
    bad = tmp_path / "9999-broken.patch"
    bad.write_text("--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -1,1 +1,1 @@\n-this line is not there\n+x\n")
    pristine = nb.pristine_tree() / "vendor" / "llama.cpp"
    with pytest.raises(nb.BuildError, match="9999-broken.patch"):
        nb.apply_patches(pristine, [bad], tmp_path / "out")


def test_build_key_changes_with_patches(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    p = tmp_path / "patches" / "0001-a.patch"
    p.write_text("one")
    k1 = nb.build_key(nb.source_inputs(tmp_path), "cpu")
    p.write_text("two")
    k2 = nb.build_key(nb.source_inputs(tmp_path), "cpu")
    assert k1 != k2 and k1.startswith(nb.LLAMA_CPP_COMMIT) and k1.endswith("-cpu")
    assert nb.build_key(nb.source_inputs(tmp_path), "cuda") != k2


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    marker = "<!-- test-command -->"
    block = readme.split(marker)[1]
    command = next(line.strip() for line in block.splitlines() if line.strip() and not line.startswith("```"))
    assert command in ci.splitlines()


def test_loaded_library_has_tap_api():
    from dflash_gguf.native.lib import EXPECTED_API_VERSION, load
    native = load()
    assert native.dflash.api_version() == EXPECTED_API_VERSION
    assert native.info["patches"] == [p.name for p in nb.source_inputs(ROOT).patches]


def test_vulkan_toolchain_missing_is_one_line_naming_the_packages(monkeypatch):
    monkeypatch.setattr(nb.shutil, "which", lambda name: None)
    monkeypatch.setattr(nb, "_has_vulkan_loader", lambda: False)
    missing = nb.missing_vulkan_toolchain()
    assert missing[0].startswith("glslc") and any("loader" in m for m in missing)
    with pytest.raises(nb.BuildError) as e:
        nb.check_vulkan_toolchain()
    message = str(e.value)
    assert "\n" not in message and "apt-get install glslc libvulkan-dev spirv-headers" in message
    assert "Vulkan SDK" in message                                    # what to install elsewhere


def test_vulkan_build_recipe_and_backend_request(monkeypatch):
    assert "-DGGML_VULKAN=ON" in nb.cmake_args("vulkan", False, None)
    assert nb.build_key(nb.source_inputs(ROOT), "vulkan").endswith("-vulkan")
    monkeypatch.setenv("DFLASH_GGUF_BACKEND", "Vulkan")
    assert nb.requested_backend() == "vulkan" and nb.default_backend() == "vulkan"
    monkeypatch.setenv("DFLASH_GGUF_BACKEND", "opencl")
    with pytest.raises(nb.BuildError, match="unknown backend"):
        nb.requested_backend()


def test_a_requested_backend_that_is_not_built_says_how_to_build_it(monkeypatch):
    from dflash_gguf.native import lib
    monkeypatch.delenv("DFLASH_GGUF_LIB_DIR", raising=False)
    monkeypatch.setenv("DFLASH_GGUF_BACKEND", "metal")
    with pytest.raises(lib.NativeLibraryError, match=r"metal build .* `dflash-gguf build --backend metal`"):
        lib.find_lib_dir()


def test_tools_asked_for_after_the_libraries_build_in_the_libraries_folder(tmp_path, monkeypatch):
    """Tools built after the libraries reuse the libraries' CMake build folder (its ggml objects are up to date:
    only common/ and the tools compile), build only the tools asked for, and install those plus the ones
    installed before, never a stale executable another build left in the shared folder. Broken variant: a tools
    build folder of its own compiled ggml (ggml-cuda: 144 objects, ~20 min) a second time."""
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "cache"))
    configured, built = [], []
    monkeypatch.setattr(nb, "configure", lambda inputs, backend, arch, tools, bdir: configured.append((bdir, tools)))

    def cmake(cmd, what, todo):
        if what == "build":
            bin_dir = Path(cmd[cmd.index("--build") + 1]) / "bin"
            bin_dir.mkdir(parents=True, exist_ok=True)
            targets = cmd[cmd.index("--target") + 1:]
            built.append(targets)
            for t in targets:
                (bin_dir / (f"lib{t}.so" if t == "llama" else t)).write_text(f"{t} of build {len(built)}")
    monkeypatch.setattr(nb, "_run", cmake)
    out = nb.build("cpu", root=ROOT)
    (nb.build_dir("cpu") / "bin" / "llama-server").write_text("left by a build of other sources")
    nb.build("cpu", tools=["llama-bench"], root=ROOT)
    nb.build("cpu", tools=["llama-speculative-simple", "llama-bench"], root=ROOT)
    assert [bdir for bdir, _ in configured] == [nb.build_dir("cpu")] * 3
    assert [tools for _, tools in configured] == [False, True, True]
    assert built == [["llama"], ["llama-bench"], ["llama-speculative-simple"]]
    installed = sorted(p.name for p in (out / "tools").iterdir())
    assert installed == ["build.json", "libllama.so", "llama-bench", "llama-speculative-simple"]
    assert (out / "tools" / "llama-bench").read_text() == "llama-bench of build 2"
