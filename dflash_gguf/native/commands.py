"""`dflash-gguf build` and `dflash-gguf doctor`."""

from __future__ import annotations

import json
from typing import Optional

import typer

from ..errors import SetupError, UserError


def register(app: typer.Typer) -> None:
    @app.command()
    def build(backend: Optional[str] = typer.Option(None, help="cpu | cuda | vulkan | metal (default: $DFLASH_GGUF_BACKEND, else detected)"),
              jobs: Optional[int] = typer.Option(None, help="parallel compile jobs"),
              tools: bool = typer.Option(False, "--tools", help="also build upstream's llama-server, llama-speculative-simple, llama-bench and ggml-rpc-server"),
              cuda_arch: Optional[str] = typer.Option(None, help="CUDA architectures: 86 RTX 30, 89 RTX 40, 120 RTX 50, "
                                                      "90 H100; several as 86;89 (default: $DFLASH_GGUF_CUDA_ARCH, "
                                                      "else the visible GPUs')")):
        """Fetch the pinned llama.cpp, apply patches/ and ggml-kernels/, build the shared libraries.

        CUDA needs no GPU and no complete toolkit: what the system lacks (nvcc, headers, cudart, cuBLAS) comes
        from NVIDIA's pinned wheels on the package index, cached in the user cache dir."""
        from .build import BuildError, build as do_build
        try:
            out = do_build(backend, jobs, tools, cuda_arch)
        except BuildError as e:
            raise SetupError(str(e)) from e
        typer.echo(out)

    @app.command()
    def doctor(as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
               backend: Optional[str] = typer.Option(None, "--backend", help="report this backend's build "
                                                     "(cpu | cuda | vulkan | metal; default: the one run would load)")):
        """Report the native build: llama.cpp commit, patches, backends, devices, tap API, library paths."""
        from .doctor import collect
        from .lib import NativeLibraryError, select_backend
        try:
            select_backend(backend)
        except NativeLibraryError as e:
            raise UserError(str(e)) from e
        report = collect()
        if as_json:
            typer.echo(json.dumps(report, indent=2))
            return
        for key, value in report.items():
            typer.echo(f"{key:>22}: {value if not isinstance(value, (list, dict)) else json.dumps(value)}")
        if not report.get("ok"):
            raise typer.Exit(1)
