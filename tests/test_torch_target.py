"""The torch target (weights dequantized from the GGUF, for harvesting on a GPU without llama.cpp) against
llama.cpp on the embedded SmolLM2 Q4_1: same greedy tokens when fed the same text, tap features close; and
the torch harvest writes the dataset format the trainer reads."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [{"category": "code", "prompt": "\ndef fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
           {"category": "chat", "prompt": "What is the capital of France? Answer in one sentence."},
           {"category": "math", "prompt": "A box holds 12 eggs. How many eggs are in 7 boxes?"}]
TAPS = [2, 11, 19, 28]


@pytest.fixture(scope="module")
def smollm2():
    from dflash_gguf.packaged_models import smollm2_q4_1
    from lab.torch_target import hf_llama_from_gguf
    target = smollm2_q4_1()
    return target, hf_llama_from_gguf(target)[0]


@pytest.mark.slow
def test_torch_target_agrees_with_llama_cpp_on_greedy_tokens_and_taps(smollm2):
    from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model
    from dflash_gguf.textgen.greedy import greedy_continuation, prefill_features
    from dflash_gguf.textgen.prompting import format_prompt
    from lab.torch_target import forward_taps
    target, hf = smollm2
    model = Model(target)
    ctx = Context(model, ContextSettings(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2))
    batch = Batch(model.native, 512)
    agree, total, rel = 0, 0, []
    for row in PROMPTS:
        prompt = format_prompt(model, row)
        seq = prompt + greedy_continuation(model, ctx, batch, prompt, 48)
        cpp_feats = prefill_features(ctx, batch, TAPS, seq)
        logits, feats = forward_taps(hf, seq, TAPS)
        written = np.asarray(seq[len(prompt):])
        agree += int((logits[len(prompt) - 1:len(seq) - 1].argmax(1) == written).sum())
        total += len(written)
        span = slice(len(prompt), len(seq))
        rel.append(np.linalg.norm(feats[span] - cpp_feats[span]) / np.linalg.norm(cpp_feats[span]))
    # the same text read by both: torch's next-token choice equals llama.cpp's greedy token almost everywhere
    # (Q4_1 x Q8_1 integer dot products vs float: only near-ties may differ)
    assert agree / total >= 0.95, (agree, total)
    assert max(rel) < 0.05, rel


@pytest.mark.slow
def test_torch_harvest_writes_a_dataset_the_trainer_reads(smollm2, tmp_path):
    from dflash_gguf.train.dataset import FeatureDataset
    from dflash_gguf.train.harvest import HarvestSettings
    from lab.torch_target import load_pretokenized, pretokenize, torch_harvest
    target, _ = smollm2
    path = pretokenize(target, PROMPTS, tmp_path / "prompts.npz")
    toks, eog = load_pretokenized(path)
    settings = HarvestSettings(taps=TAPS, n_parallel=2, max_new={"code": 12, "chat": 12, "math": 12},
                               sampled_fraction=0.0, top_k_probs=4)
    torch_harvest(target, PROMPTS, toks, eog, tmp_path / "d", settings, device="cpu", dtype="float32")
    data = FeatureDataset(tmp_path / "d")
    assert sorted(r["prompt_index"] for r in data.index) == [0, 1, 2]
    for r in data.index:
        (s, e), off = r["spans"][0], r["offset"]
        assert data.tokens[off:off + s].tolist() == toks[r["prompt_index"]]
        np.testing.assert_array_equal(data.topk_ids[off + s - 1:off + e - 1, 0], data.tokens[off + s:off + e])
        assert np.abs(data.feats[off:off + e - 1].astype(np.float32)).sum(1).min() > 0   # every decoded row has taps
    assert data.blocks(0, 4, 4, 0, np.random.default_rng(0)) is not None
