"""The one description of a target: what a drafter (converted or trained) needs to know about it, read from the
header gguf_check validated (no weights loaded)."""

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
    rope_theta: float | None        # None: the file does not say
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rms_eps: float
    mask_token: int                 # an id the target never writes (see _mask_token)


def read_gguf(path: Path, what: str = "file"):
    """A GGUF reader for `path` (gguf_reader: the GGUFReader API subset convert uses), reused while the file
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
    from ..gguf_reader import open_gguf  # noqa: PLC0415
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
    n_embd, n_head = int(field(f"{arch}.embedding_length")), int(field(f"{arch}.attention.head_count", 1))
    return TargetInfo(path=path, arch=arch, name=str(field("general.name", path.stem)),
                      n_embd=n_embd, n_layer=int(field(f"{arch}.block_count")),
                      n_vocab=len(tokens.contents()), n_ctx_train=int(field(f"{arch}.context_length", 0) or 0),
                      tokenizer_fields=tok_fields, rope_theta=_float(field(f"{arch}.rope.freq_base")),
                      n_head=n_head, n_head_kv=int(field(f"{arch}.attention.head_count_kv", n_head)),
                      head_dim=int(field(f"{arch}.attention.key_length", n_embd // n_head)),
                      n_ff=int(field(f"{arch}.feed_forward_length", 0)),
                      rms_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
                      mask_token=_mask_token(field))


def _mask_token(field) -> int:
    """The target's dedicated mask token if any, else its unknown token (padding last: it is often the
    end-of-text token, which does appear as an input)."""
    for key in ("tokenizer.ggml.mask_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"):
        if field(key) is not None:
            return int(field(key))
    return 0


def _float(value) -> float | None:
    return None if value is None else float(value)
