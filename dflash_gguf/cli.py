"""`dflash-gguf` command line: one sub-command per area, each registered by its own package.

Registration imports only light modules; heavy dependencies (native library, torch, FastAPI)
load inside the commands, so `--help` works on a machine without any of them.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer

from .errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="DFlash block-diffusion speculative decoding for GGUF models on llama.cpp. "
                       "Errors are one line (exit 2: bad input, 1: runtime failure); --debug adds the traceback.")

# Each module defines `register(app)`.
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
        importlib.import_module(name).register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Run a command; every failure ends as one line on stderr and exit code 2 (input) or 1 (runtime).
    `--debug` (anywhere on the line) or DFLASH_GGUF_DEBUG=1 adds the traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("DFLASH_GGUF_DEBUG", "") not in ("", "0")
    args = [a for a in args if a != "--debug"]
    try:
        app(args=args, prog_name="dflash-gguf")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except UserError as e:
        _fail(str(e), e.exit_code, debug)
    except Exception as e:  # noqa: BLE001 - nothing reaches a person as a traceback without --debug
        _fail(f"{type(e).__name__}: {e}; run again with --debug for the traceback and report it", 1, debug)


def _fail(message: str, code: int, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
