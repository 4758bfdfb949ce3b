"""What a drafter needs to know about its target, read from the GGUF header (no weights loaded)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..gguf_check import check_target


@dataclass
class TargetInfo:
    path: Path
    arch: str
    name: str
    n_embd: int
    n_layer: int
    n_vocab: int
    n_ctx_train: int
    tokenizer_fields: dict          # key → (value, GGUFValueType, sub type) for copying
    rope_theta: float | None = None


def read_gguf(path: Path, what: str = "file"):
    """A GGUF reader for `path` (gguf_fast: the GGUFReader API subset convert uses), reused while the file
    is unchanged: convert and inspect look at the same header several times."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such {what}")
    return _reader(str(path), *_key(path))     # gguf_check names the file and what is wrong with it


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _reader(shown: str, resolved: str, size: int, mtime_ns: int):
    from .gguf_fast import open_gguf  # noqa: PLC0415
    return open_gguf(shown)


def read_target(path: Path) -> TargetInfo:
    path = Path(path)
    check_target(path)              # the validation every command runs before llama.cpp sees a file
    r = read_gguf(path, "target GGUF")
    return dataclasses.replace(_target(r, *_key(path)), path=path)


@functools.lru_cache(maxsize=4)
def _target(r, resolved: str, size: int, mtime_ns: int) -> TargetInfo:
    path = Path(resolved)

    def field(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    arch = field("general.architecture")
    if arch is None:
        raise UserError(f"{path}: no general.architecture in the GGUF header; is this a model file?")
    if "dflash" in str(arch):
        raise UserError(f"{path} is a DFlash drafter, not a target model; pass the model it drafts for")
    if field(f"{arch}.embedding_length") is None or field(f"{arch}.block_count") is None:
        raise UserError(f"{path}: no {arch}.embedding_length / {arch}.block_count; is this a language model GGUF?")
    tokens = r.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise UserError(f"{path}: the target has no tokenizer (tokenizer.ggml.tokens)")
    tok_fields = {}
    for key, f in r.fields.items():
        if key.startswith("tokenizer."):
            sub = f.types[1] if len(f.types) > 1 else None
            tok_fields[key] = (f.contents(), f.types[0], sub)
    return TargetInfo(path=path, arch=arch, name=str(field("general.name", path.stem)),
                      n_embd=int(field(f"{arch}.embedding_length")), n_layer=int(field(f"{arch}.block_count")),
                      n_vocab=len(tokens.contents()), n_ctx_train=int(field(f"{arch}.context_length", 0) or 0),
                      tokenizer_fields=tok_fields, rope_theta=_float(field(f"{arch}.rope.freq_base")))


def _float(value) -> float | None:
    return None if value is None else float(value)
