"""Synthetic GGUFs: random weights of a given shape under a made-up vocabulary, for tests and for timing.

The vocabulary is SentencePiece-style: <unk>, <s>, </s>, then words `▁t3`, `▁t4`, ..., and optionally the 256
byte tokens, with which any text tokenizes (without them llama.cpp aborts on text it cannot cover).
"""

from __future__ import annotations

import numpy as np


def add_synthetic_vocab(w, n_words: int, byte_tokens: bool) -> int:
    """The made-up vocabulary (BOS 1, EOS 2, no automatic BOS); returns its size."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(3, 3 + n_words)]
    types = [2, 3, 3] + [1] * n_words
    if byte_tokens:
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        types += [6] * 256
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    return len(tokens)


class RandomTensors:
    """Random tensors into a GGUFWriter; numpy shapes are [out, in] (ggml ne reversed)."""

    def __init__(self, writer, seed: int, dtype=np.float32):
        self.w, self.rng, self.dtype = writer, np.random.default_rng(seed), dtype

    def rand(self, name: str, *shape: int, scale: float | None = None) -> None:
        arr = self.rng.standard_normal(shape) * (scale if scale is not None else 1.0 / np.sqrt(shape[-1]))
        self.w.add_tensor(name, arr.astype(self.dtype if len(shape) > 1 else np.float32))

    def ones(self, name: str, n: int) -> None:
        self.w.add_tensor(name, np.ones(n, dtype=np.float32))

    def attention(self, i: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, qk_norm: bool) -> None:
        self.ones(f"blk.{i}.attn_norm.weight", n_embd)
        self.rand(f"blk.{i}.attn_q.weight", n_head * head_dim, n_embd)
        self.rand(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd)
        self.rand(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd)
        self.rand(f"blk.{i}.attn_output.weight", n_embd, n_head * head_dim)
        if qk_norm:
            self.ones(f"blk.{i}.attn_q_norm.weight", head_dim)
            self.ones(f"blk.{i}.attn_k_norm.weight", head_dim)
        self.ones(f"blk.{i}.ffn_norm.weight", n_embd)

    def dense_ffn(self, i: int, n_embd: int, n_ff: int) -> None:
        self.rand(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        self.rand(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        self.rand(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
