"""The server's prompt cache (server/prompt_cache.py) over a tiny real engine: conversations parked in RAM come
back exactly (target and drafter compute the bits of a cold start), the RAM budget holds under a burst of
different conversations, `cache_prompt: false` starts cold, and slot files round-trip exactly but are refused by
an engine they were not made for."""

import pytest

from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.engine.target import WIDE_ROWS
from dflash_gguf.server.prompt_cache import CacheSettings, PromptCache, SlotFileError
from dflash_gguf.server.worker import engine_identity
from helpers.engine import assert_same_bits, next_step_logits, tiny_speculative_engine, width_dependent

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = width_dependent(tiny_speculative_engine(tmp_path_factory.mktemp("cache")))   # the bookkeeping checked too
    yield eng
    eng.close()


def conversation(i: int, n: int = 100) -> list[int]:
    return [1] + [3 + (i * 7 + k * (i % 5 + 1)) % 28 for k in range(n)]


def run(cache: PromptCache, prompt: list[int], use_cache: bool = True):
    """One request as the worker serves it: prepare, generate, settle."""
    k = cache.prepare(prompt, use_cache)
    tokens = cache.engine.generate(prompt, 12, GREEDY, n_cached=k).tokens
    cache.settle()
    return k, tokens


def cold(engine, prompt):
    engine.forget()
    return engine.generate(prompt, 12, GREEDY).tokens


def assert_continues_exactly(cache: PromptCache, prompt: list[int]) -> int:
    """The request `prompt` after `cache.prepare`: target and drafter compute what they compute from a cold start,
    bit for bit (a random tiny drafter's drafts do not change greedy tokens, its logits do); returns the reused
    length."""
    k = cache.prepare(prompt, True)
    warm = next_step_logits(cache.engine, prompt, k)
    cache.engine.forget()
    assert_same_bits(warm, next_step_logits(cache.engine, prompt, 0))
    return k


def test_a_parked_conversation_comes_back_exactly(engine):
    """Fails when the drafter's KV is not restored from RAM (prefix.restore leaves the other conversation's)."""
    cache = PromptCache(engine, CacheSettings(ram_bytes=None), engine_identity(engine))
    engine.forget()
    a, b = conversation(1), conversation(2)
    _, answer = run(cache, a)
    run(cache, b)                                         # replaces A, which is parked first
    assert cache.n_parked == 1 and len(cache.saved) == 1
    follow = a + answer + [5, 6, 7]
    k = assert_continues_exactly(cache, follow)
    assert cache.n_restored == 1 and k == len(follow) - WIDE_ROWS


def test_cache_prompt_false_starts_cold(engine):
    cache = PromptCache(engine, CacheSettings(), engine_identity(engine))
    p = conversation(3)
    run(cache, p)
    k, tokens = run(cache, p + [9], use_cache=False)
    assert k == 0 and tokens == cold(engine, p + [9])
    off = PromptCache(engine, CacheSettings(enabled=False), engine_identity(engine))
    assert off.prepare(p, True) == 0                     # --no-cache-prompt


def test_ram_budget_holds_under_a_burst_of_conversations(engine):
    engine.forget()
    probe = PromptCache(engine, CacheSettings(ram_bytes=None), engine_identity(engine))
    run(probe, conversation(0))
    one = engine.snapshot().nbytes                        # what one parked conversation of this size costs
    budget = int(2.5 * one)
    cache = PromptCache(engine, CacheSettings(ram_bytes=budget), engine_identity(engine))
    answers = {}
    for i in range(10, 40):
        _, answers[i] = run(cache, conversation(i))
        assert cache.ram_used <= budget
    assert 1 <= len(cache.saved) <= 2 and cache.n_evicted >= 25
    newest_parked = 38                                    # 39 is held, 38 and maybe 37 wait in RAM
    follow = conversation(newest_parked) + answers[newest_parked] + [4]
    restored = cache.n_restored
    assert assert_continues_exactly(cache, follow) == len(follow) - WIDE_ROWS and cache.n_restored == restored + 1
    oldest = conversation(10) + answers[10] + [4]         # long evicted: nothing comes back, still exact
    restored = cache.n_restored
    k, tokens = run(cache, oldest)
    assert cache.n_restored == restored and k < 10 and tokens == cold(engine, oldest)


def test_slot_files_round_trip_and_name_their_engine(engine, tmp_path):
    """Fails when the drafter's KV is not restored from the file (prefix.restore leaves it empty)."""
    cache = PromptCache(engine, CacheSettings(slot_dir=tmp_path), engine_identity(engine))
    p = conversation(5)
    _, answer = run(cache, p)
    n_saved, n_written = cache.save_slot("chat.bin")
    assert n_saved == len(p) + len(answer) - 1 and n_written == (tmp_path / "chat.bin").stat().st_size
    assert cache.erase_slot() == n_saved and engine.held_tokens == []
    assert cache.restore_slot("chat.bin") == (n_saved, n_written)
    follow = p + answer + [8]
    assert assert_continues_exactly(cache, follow) == len(follow) - WIDE_ROWS

    other = PromptCache(engine, CacheSettings(slot_dir=tmp_path), {**engine_identity(engine), "n_ctx": 4096})
    with pytest.raises(SlotFileError, match="n_ctx"):
        other.restore_slot("chat.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a slot")
    with pytest.raises(SlotFileError, match="not a dflash-gguf slot file"):
        cache.restore_slot("junk.bin")
    with pytest.raises(SlotFileError, match="plain file name"):
        cache.save_slot("../escape.bin")
    with pytest.raises(SlotFileError) as e:
        cache.restore_slot("missing.bin")
    assert e.value.http_status == 404
    no_dir = PromptCache(engine, CacheSettings(), engine_identity(engine))
    with pytest.raises(SlotFileError) as e:
        no_dir.save_slot("x.bin")
    assert e.value.http_status == 501


@pytest.mark.parametrize("attention", ["width-dependent", "one-order"])
def test_a_follow_up_queued_behind_its_answer_does_not_wait_for_the_re_decode(tmp_path, attention):
    """A follow-up sent at once answers exactly as a cold start. Width-dependent attention: the worker's re-decode
    of the answer (EngineWorker._settle) yields to the queued request, which prefills what was not re-decoded
    (broken variant caught: settle not told that a request waits — the whole answer is re-decoded first, and the
    follow-up reuses it: n_cached). Our CPU build's one order (patches/0012): nothing to re-decode, the follow-up
    reuses the whole answer. The time it saves is measured in docs/serve.md."""
    import asyncio

    from dflash_gguf.engine.text import TextStream
    from dflash_gguf.server.worker import END_EVENTS, EngineWorker, Job
    eng = tiny_speculative_engine(tmp_path)
    if attention == "width-dependent":
        width_dependent(eng)
    first = conversation(4, 60)
    eng.forget()
    answer = eng.generate(first, 200, GREEDY).tokens
    follow = first + answer + [5, 6, 7]
    expected = cold(eng, follow)
    eng.forget()
    worker = EngineWorker(lambda: eng, cache=CacheSettings()).start()       # closes the engine when it stops
    assert worker.ready.wait(60)

    async def both() -> list:
        loop = asyncio.get_running_loop()
        jobs = [Job(p, n, GREEDY, TextStream(eng.target_model.token_bytes), loop) for p, n in ((first, 200), (follow, 12))]
        for job in jobs:                                   # the follow-up is queued while the first one generates
            worker.submit(job)
        ends = []
        for job in jobs:
            while (event := await job.events.get())[0] not in END_EVENTS:
                pass
            ends.append(event)
        return ends

    try:
        (kind_a, a), (kind_b, b) = asyncio.run(both())
    finally:
        worker.stop()
    assert (kind_a, kind_b) == ("done", "done") and a.tokens == answer
    assert b.tokens == expected
    if attention == "width-dependent":
        assert b.n_cached < len(first) + len(answer) - WIDE_ROWS
    else:
        assert b.n_cached == len(first) + len(answer) - 1
