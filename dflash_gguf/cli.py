"""`dflash-gguf` command line: one sub-command per area, each registered by its own package.

Registration imports only light modules; heavy dependencies (native library, torch, FastAPI)
load inside the commands, so `--help` works on a machine without any of them.
"""

from __future__ import annotations

import importlib
import sys

import typer

from .errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="DFlash block-diffusion speculative decoding for GGUF models on llama.cpp.")

# Each module defines `register(app)`; a module that is missing (area not built yet) is skipped.
_COMMAND_MODULES = [
    "dflash_gguf.native.commands",      # build, doctor
    "dflash_gguf.convert.commands",     # convert, inspect
    "dflash_gguf.engine.commands",      # run
    "dflash_gguf.train.commands",       # train
    "dflash_gguf.bench.commands",       # bench
    "dflash_gguf.server.commands",      # serve, models
]


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue
            raise
        module.register(app)


_register_all()


def main() -> None:
    try:
        app()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
