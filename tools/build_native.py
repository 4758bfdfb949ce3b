#!/usr/bin/env python3
"""Build the patched llama.cpp libraries (same as `dflash-gguf build`); runs before installation."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash_gguf.native.build import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
