"""One target GGUF as every command sees it, opened once and passed down: its validated header (no weights
loaded), its tensors, its end-of-generation token ids, its sha256, and the target loaded in llama.cpp at most
once and shared by whatever needs it (the preflight, the harvest, the token counts, the writer's load check)."""

from __future__ import annotations

import functools
from pathlib import Path

from .errors import UserError


class TargetFile:
    def __init__(self, path: Path):
        """The target at `path`, validated (gguf_check.check_target: a missing, damaged or non-target file is a
        one-line error naming it) before llama.cpp ever sees it."""
        from .gguf_check import check_target  # noqa: PLC0415
        self.path = Path(path)
        self.header = check_target(self.path)
        self._model = None
        if "dflash" in self.header.arch:
            raise UserError(f"{self.path} is a DFlash drafter, not a target model; pass the model it drafts for")
        try:
            self._read_facts()
        except (TypeError, ValueError) as e:
            raise UserError(f"{self.path}: not a readable GGUF target ({type(e).__name__}: {e})") from None

    def _read_facts(self) -> None:
        self.arch = arch = self.header.arch          # check_target: present, with block count and hidden size
        value = self.header.value
        self.name = str(value("general.name", self.path.stem))
        self.n_embd = int(value(f"{arch}.embedding_length"))
        self.n_layer = int(value(f"{arch}.block_count"))
        self.n_vocab = self.header.n_vocab()
        self.n_ctx_train = int(value(f"{arch}.context_length", 0) or 0)
        rope = value(f"{arch}.rope.freq_base")
        self.rope_theta = None if rope is None else float(rope)      # None: the file does not say
        self.n_head = int(value(f"{arch}.attention.head_count", 1))
        self.n_head_kv = int(value(f"{arch}.attention.head_count_kv", self.n_head))
        self.head_dim = int(value(f"{arch}.attention.key_length", self.n_embd // self.n_head))
        self.n_ff = int(value(f"{arch}.feed_forward_length", 0))
        self.rms_eps = float(value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))

    @classmethod
    def open(cls, path: Path) -> "TargetFile":
        return cls(path)

    @classmethod
    def of(cls, target: "TargetFile | Path | str") -> "TargetFile":
        """`target` itself, or the target file at that path (for callers that hold a path only)."""
        return target if isinstance(target, TargetFile) else cls(Path(target))

    @property
    def tokenizer_fields(self) -> dict:
        """key → (value, GGUFValueType, sub type) of every tokenizer key, for copying into a drafter."""
        return {key: (f.value, f.types[0], f.types[1] if len(f.types) > 1 else None)
                for key, f in self.header.fields.items() if key.startswith("tokenizer.")}

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

    def close(self) -> None:
        self.release_model()

    def __enter__(self) -> "TargetFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
