"""dflash_gguf.native.lib refuses llama-cpp-python bindings of another release before they load our library:
their ctypes structures would not match the pinned llama.cpp, and the first model load would crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dflash_gguf.native.build import LLAMA_CPP_PYTHON_VERSION

ROOT = Path(__file__).resolve().parent.parent


def _load_with_bindings(tmp: Path, version: str) -> subprocess.CompletedProcess:
    pkg = tmp / version / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'raise SystemExit("imported")\n__version__ = "{version}"\n')
    code = ("from dflash_gguf.native.lib import NativeLibraryError, check_bindings_version\n"
            "try:\n    check_bindings_version()\nexcept NativeLibraryError as e:\n    print(e)\nelse:\n    print('accepted')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg.parent), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_bindings_of_another_release_are_refused_without_importing_them(tmp_path):
    out = _load_with_bindings(tmp_path, "0.3.16")
    assert out.returncode == 0, out.stderr
    assert "llama_cpp 0.3.16" in out.stdout and f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}" in out.stdout
    assert "imported" not in out.stdout + out.stderr         # read, never imported (the import loads a library)


def test_bindings_of_the_pinned_release_are_accepted(tmp_path):
    out = _load_with_bindings(tmp_path, LLAMA_CPP_PYTHON_VERSION)
    assert out.returncode == 0 and out.stdout.strip() == "accepted", out.stdout + out.stderr
