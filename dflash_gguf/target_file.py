"""One target GGUF as every command sees it, opened once and passed down: its validated header (no weights
loaded), its tensors, its end-of-generation token ids, its sha256, and the target loaded in llama.cpp at most
once and shared by whatever needs it (the preflight, the harvest, the token counts, the writer's load check)."""

from __future__ import annotations

import functools
from pathlib import Path

from .errors import UserError


class _Fact:
    """A number under "{arch}.<key>" in the header, read on first use: what convert and train need to shape a
    drafter (the engine reads none of them, so a target they cannot describe still runs)."""

    def __init__(self, key: str, kind=int, default=None):
        self.key, self.kind, self.default = key, kind, default

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, target: "TargetFile", owner=None):
        raw = target.header.value(f"{target.arch}.{self.key}")
        try:
            value = (self.default(target) if callable(self.default) else self.default) if raw is None \
                else self.kind(raw)
        except (TypeError, ValueError):
            raise UserError(f"{target.path}: {target.arch}.{self.key} is {raw!r}, not one number; a drafter "
                            "cannot be shaped for this target") from None
        target.__dict__[self.name] = value
        return value


class TargetFile:
    n_embd = _Fact("embedding_length")                # check_target: present, with the block count
    n_layer = _Fact("block_count")
    n_ctx_train = _Fact("context_length", int, 0)
    rope_theta = _Fact("rope.freq_base", float)       # None: the file does not say
    n_head = _Fact("attention.head_count", int, 1)
    n_head_kv = _Fact("attention.head_count_kv", int, lambda t: t.n_head)
    head_dim = _Fact("attention.key_length", int, lambda t: t.n_embd // t.n_head)
    n_ff = _Fact("feed_forward_length", int, 0)
    rms_eps = _Fact("attention.layer_norm_rms_epsilon", float, 1e-6)

    def __init__(self, path: Path):
        """The target at `path`, validated by gguf_check.check_target before llama.cpp ever sees it (a missing,
        damaged or non-target file is a one-line error naming it)."""
        from .gguf_check import check_target  # noqa: PLC0415
        self.path = Path(path)
        self.header = check_target(self.path)
        self.arch: str = self.header.arch
        if "dflash" in self.arch:
            raise UserError(f"{self.path} is a DFlash drafter, not a target model; pass the model it drafts for")
        self.name = str(self.header.value("general.name", self.path.stem))
        self.n_vocab: int = self.header.n_vocab()
        self._model = None

    @classmethod
    def open(cls, path: Path) -> "TargetFile":
        return cls(path)

    @property
    def mask_token(self) -> int:
        """The target's dedicated mask token if any, else its unknown token (padding last: it is often the
        end-of-text token, which does appear as an input)."""
        for key in ("tokenizer.ggml.mask_token_id", "tokenizer.ggml.unknown_token_id",
                    "tokenizer.ggml.padding_token_id"):
            if self.header.value(key) is not None:
                return int(self.header.value(key))
        return 0

    @functools.cached_property
    def tensors(self) -> dict:
        """name → gguf_reader.Tensor (data memory-mapped, as stored)."""
        from .gguf_reader import FastGGUFReader  # noqa: PLC0415
        return {t.name: t for t in FastGGUFReader(self.path).tensors}

    @functools.cached_property
    def sha256(self) -> str:
        from .paths import sha256_file  # noqa: PLC0415
        return sha256_file(self.path)

    @functools.cached_property
    def eog_ids(self) -> list[int]:
        """The token ids llama.cpp ends a generation on (from the loaded target, whatever its placement)."""
        model = self._model or self.model()
        return [t for t in range(model.n_vocab) if model.is_eog(t)]

    def model(self, n_gpu_layers: int = 0):
        """The target loaded in llama.cpp (native.wrappers.Model), shared until `release_model`; asked with
        another -ngl than it was loaded with, it is loaded again that way."""
        if self._model is not None and self._model.n_gpu_layers != n_gpu_layers:
            self.release_model()
        if self._model is None:
            from .native.wrappers import Model  # noqa: PLC0415
            self._model = Model(self.path, n_gpu_layers=n_gpu_layers)
        return self._model

    def release_model(self) -> None:
        """Free the loaded target (its memory is wanted elsewhere, e.g. by training); a later `model()` reloads."""
        if self._model is not None:
            self._model.close()
            self._model = None

    close = release_model

    def __enter__(self) -> "TargetFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
