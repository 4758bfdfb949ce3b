"""-ctk / -ctv (llama.cpp's KV cache types): validated with the option that sets them, passed to the target's and
the drafter's contexts, lossless (greedy speculative = plain with a Q8_0 cache), reported by GET /props and part
of what a slot file must match."""

import httpx
import pytest
from typer.testing import CliRunner

from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.errors import UserError
from dflash_gguf.settings import EngineSettings

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number.",
           "List three facts about the Moon, one per line.")


@pytest.mark.parametrize("changes,names", [
    ({"cache_type_k": "q3_k"}, "-ctk/--cache-type-k q3_k: must be one of"),
    ({"cache_type_v": "Q8_0"}, "-ctv/--cache-type-v Q8_0: must be one of"),
    ({"cache_type_v": "q4_0", "flash_attn": "off"}, "a quantized V cache needs flash attention"),
])
def test_a_kv_type_llama_cpp_refuses_is_named(changes, names):
    with pytest.raises(UserError, match=names):
        EngineSettings(**changes).validate()
    EngineSettings(cache_type_k="q8_0", flash_attn="off").validate()   # a quantized K alone needs no flash attention


def test_the_flags_reach_the_settings():
    """Broken variant caught: an option declared but not passed on (or not declared) keeps the f16 default."""
    import typer

    from dflash_gguf.engine_options import with_engine_options
    seen = {}

    @with_engine_options
    def command(engine_options: dict):
        seen.update(engine_options)

    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["command", "-ctk", "q8_0", "--cache-type-v", "q4_0"])
    assert result.exit_code == 0, result.output
    s = EngineSettings.from_env(**seen)
    assert (s.cache_type_k, s.cache_type_v) == ("q8_0", "q4_0")


@pytest.fixture(scope="module")
def q8_engine():
    from dflash_gguf.engine.session import Engine
    engine = Engine(EngineSettings(n_ctx=512, n_threads=1, cache_type_k="q8_0", cache_type_v="q8_0"))
    yield engine
    engine.close()


def _kv_bytes_per_position(engine) -> float:
    """Bytes the target's state grows by per held position (its KV rows; a few bytes of cell metadata)."""
    prompt = engine.tokenize(PROMPTS[0])
    engine.forget()
    engine.generate(prompt[:8], 1, speculative=False)
    small = len(engine.target.ctx.state_get(partial=False))
    engine.forget()
    engine.generate(prompt, 1, speculative=False)
    return (len(engine.target.ctx.state_get(partial=False)) - small) / (len(prompt) - 8)


def test_a_q8_0_kv_cache_is_lossless_and_used(q8_engine):
    """Greedy speculative decoding with -ctk q8_0 -ctv q8_0 equals plain decoding with the same cache, and the
    cache is Q8_0 (broken variant caught: the types not passed to llama.cpp, which then keeps F16 rows)."""
    m = q8_engine.target_model
    arch = m.meta("general.architecture")
    n_layer, n_head = int(m.meta(f"{arch}.block_count")), int(m.meta(f"{arch}.attention.head_count"))
    n_kv = int(m.meta(f"{arch}.attention.head_count_kv")) * (int(m.meta(f"{arch}.embedding_length")) // n_head)
    f16_row_bytes = 2 * n_layer * n_kv * 2                                # K and V, every layer, 2 bytes a value
    assert _kv_bytes_per_position(q8_engine) < 0.6 * f16_row_bytes         # Q8_0: 34 bytes per 32 values
    drafted = 0
    for text in PROMPTS:
        prompt = q8_engine.tokenize(text)
        q8_engine.forget()
        plain = q8_engine.generate(prompt, 48, SamplingParams(), speculative=False).tokens
        q8_engine.forget()
        spec = q8_engine.generate(prompt, 48, SamplingParams())
        assert spec.tokens == plain, f"{text!r}: speculative output diverged with a Q8_0 KV cache"
        drafted += spec.n_drafted
    assert drafted > 0                                                     # the drafter ran


@pytest.fixture(scope="module")
def f16_engine():
    from dflash_gguf.engine.session import Engine
    engine = Engine(EngineSettings(n_ctx=512, n_threads=1))
    yield engine
    engine.close()


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_a_kv_cache_reuses_a_whole_conversation_without_re_decoding_it(kv, request):
    """Each attention row in one order for every ubatch width (patches/0012 for F16/F32 K and V; ggml's row-by-row
    kernel for Q8_0) and width-invariant matmuls: the positions a generation decoded in verify batches are what a
    prefill computes, so the next turn reuses all of them with no re-decode (a follow-up sent at once waits for
    nothing), and its last logits are a cold prefill's bits, on the real default model. Broken variant caught:
    ggml's tiled kernel for >= 64 rows (the dispatch before patch 0012) — the F16 case's last logits then differ."""
    import numpy as np

    from dflash_gguf.native.wrappers import ContextSettings
    from dflash_gguf.engine.target import width_invariant
    engine = request.getfixturevalue(f"{'f16' if kv == 'f16' else 'q8'}_engine")
    assert not width_invariant(ContextSettings()) and width_invariant(ContextSettings(), cpu_one_order=True)
    assert not width_invariant(ContextSettings(type_k="f32", type_v="f32"))
    assert width_invariant(ContextSettings(type_k="q8_0", type_v="q8_0"))
    assert not width_invariant(ContextSettings(type_k="q8_0", type_v="q8_0", flash_attn="off"), cpu_one_order=True)
    assert engine.target.width_invariant
    prompt = engine.tokenize(PROMPTS[0] * 6)
    engine.forget()
    answer = engine.generate(prompt, 40, SamplingParams()).tokens
    assert engine.widen() == 0
    follow = prompt + answer + engine.tokenize(" Shorter, please.", add_special=False)
    k = engine.keep_prefix(follow)
    assert k == len(prompt) + len(answer) - 1
    warm = engine.target.prefill(follow[k:], None)
    engine.forget()
    assert np.array_equal(warm, engine.target.prefill(follow, None))


def test_attention_gives_each_row_the_same_bits_in_any_ubatch_split(f16_engine):
    """The default model's logits after 300 positions are the same bits whether they were decoded as one prefill,
    in 7-row verify batches, token by token or in other splits (F16 K/V, patches/0012). Broken variant caught: ggml's
    tiled kernel for >= 64 rows (row by row below): 256+44 vs 300x1 differ by up to ~1 logit (measured)."""
    import numpy as np
    t = f16_engine.target
    toks = [(17 + 7919 * i) % f16_engine.target_model.n_vocab for i in range(300)]

    def last_logits(splits):
        t.reset()
        i = 0
        for n in splits:
            t.decode_rows(toks[i:i + n])
            i += n
        return np.array(t.ctx.logits_all(splits[-1]))[-1]

    ref = last_logits([300])
    for splits in ([256, 44], [7] * 42 + [6], [200] + [1] * 100, [64, 1, 64, 171]):
        assert np.array_equal(last_logits(splits), ref), splits[:4]
    f16_engine.forget()


def test_props_and_slot_identity_name_the_kv_types(q8_engine):
    from dflash_gguf.server.worker import engine_identity
    from helpers.server import LiveServer
    assert {k: engine_identity(q8_engine)[k] for k in ("cache_type_k", "cache_type_v")} == \
        {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}
    srv = LiveServer(lambda: q8_engine).wait_ready()          # closes the engine when it stops: the last test
    try:
        props = httpx.get(srv.base + "/props", timeout=30).json()
    finally:
        srv.close()
    assert (props["cache_type_k"], props["cache_type_v"]) == ("q8_0", "q8_0")
