"""Tiny random GGUF targets of each architecture a drafter can be trained for, written with gguf-py in the
layout llama.cpp's converter gives real models (src/models/<arch>.cpp load_arch_tensors): Qwen2's q/k/v biases,
Qwen3's q/k norms, Phi-3's fused qkv and gate/up, Gemma 2/3's post norms, sliding windows and soft-capping."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lab.synthetic import RandomTensors, add_synthetic_vocab
from dflash_gguf.convert.writer import add_decoder_hparams, finish

ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "mistral3", "gemma2", "gemma3")
E, L, NH, NKV, HD, FF = 64, 4, 4, 2, 16, 128


def write_tiny_target(out: Path, arch: str, seed: int = 0) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(out), arch)
    add_decoder_hparams(w, n_layer=L, n_ctx=1024, n_embd=E, n_ff=FF, n_head=NH, n_head_kv=NKV, head_dim=HD,
                        rms_eps=1e-6, rope_base=10000.0)
    w.add_rope_dimension_count(HD)
    w.add_file_type(0)
    if arch == "qwen3moe":
        w.add_expert_count(4)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(FF)
    if arch in ("gemma2", "gemma3"):
        w.add_sliding_window(32)                 # shorter than the test sequences: the local layers matter
    if arch == "gemma2":
        w.add_final_logit_softcapping(30.0)
        w.add_attn_logit_softcapping(50.0)
    n_vocab = add_synthetic_vocab(w, 29, byte_tokens=True)
    ts = RandomTensors(w, seed)
    ts.rand("token_embd.weight", n_vocab, E, scale=0.3 if arch.startswith("gemma") else 1.0)
    ts.ones("output_norm.weight", E)
    if not arch.startswith("gemma"):             # Gemma ties its head to the embeddings
        ts.rand("output.weight", n_vocab, E, scale=4.0 / np.sqrt(E))
    for i in range(L):
        _layer(ts, arch, i)
    finish(w)
    return out


def _layer(ts: RandomTensors, arch: str, i: int) -> None:
    b = f"blk.{i}."
    if arch == "phi3":
        ts.ones(b + "attn_norm.weight", E)
        ts.rand(b + "attn_qkv.weight", (NH + 2 * NKV) * HD, E)
        ts.rand(b + "attn_output.weight", E, NH * HD)
        ts.ones(b + "ffn_norm.weight", E)
        ts.rand(b + "ffn_up.weight", 2 * FF, E)
        ts.rand(b + "ffn_down.weight", E, FF)
        return
    ts.attention(i, E, NH, NKV, HD, qk_norm=arch in ("qwen3", "qwen3moe", "gemma3"))
    if arch == "qwen2":
        for name, n in (("attn_q", NH * HD), ("attn_k", NKV * HD), ("attn_v", NKV * HD)):
            ts.rand(b + f"{name}.bias", n, scale=0.1)
    if arch in ("gemma2", "gemma3"):
        ts.ones(b + "post_attention_norm.weight", E)
        ts.ones(b + "post_ffw_norm.weight", E)
    if arch == "qwen3moe":
        ts.rand(b + "ffn_gate_inp.weight", 4, E)
        ts.rand(b + "ffn_gate_exps.weight", 4, FF, E)
        ts.rand(b + "ffn_up_exps.weight", 4, FF, E)
        ts.rand(b + "ffn_down_exps.weight", 4, E, FF)
    else:
        ts.dense_ffn(i, E, FF)
