"""A reduced draft vocabulary (own head rows + d2t): exact logits on its tokens, -inf elsewhere, lossless
speculation at T=0 and T>0, carried through re-conversion, and damaged d2t tensors refused."""

from pathlib import Path

import numpy as np
import pytest

from dflash_gguf.drafter import draft_vocab as dv
from dflash_gguf.convert.flavours import detect_flavour, normalize_gguf
from dflash_gguf.convert.inspect_drafter import inspect_drafter
from dflash_gguf.target_file import TargetFile
from dflash_gguf.convert.writer import finish, write_dflash_gguf
from dflash_gguf.engine.sources.dflash import DFlashSource
from dflash_gguf.engine.loop import SpecDecoder
from dflash_gguf.engine.policy import DraftLengthPolicy
from dflash_gguf.engine.sampling import SamplingParams
from dflash_gguf.engine.target import Target
from dflash_gguf.errors import UserError
from dflash_gguf.native.wrappers import ContextSettings, Model
from helpers.engine import assert_same_distribution, exact_second_token_marginal, write_random_drafter, write_tiny_llama

SETTINGS = ContextSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)


def test_choose_tokens_by_count_then_id_and_keeps_eog():
    counts = np.array([0, 5, 9, 5, 0, 1, 7, 0])
    assert dv.choose_tokens(counts, 3).tolist() == [1, 2, 6]
    assert dv.choose_tokens(counts, 4).tolist() == [1, 2, 3, 6]           # tie 5/5: lower id first
    assert dv.choose_tokens(counts, 3, keep=[7]).tolist() == [2, 6, 7]   # kept tokens count towards K
    assert dv.coverage(np.array([2, 6]), counts) == pytest.approx(16 / 27)
    with pytest.raises(UserError, match="--draft-vocab 9"):
        dv.choose_tokens(counts, 9)


def _reduced(target: Path, full: Path, out: Path, ids: list[int]) -> Path:
    tf = TargetFile.open(target)
    src = normalize_gguf(full, detect_flavour(full), tf)
    counts = np.zeros(tf.n_vocab, np.int64)
    counts[ids] = 100
    vocab = dv.build(tf, counts, len(ids), keep=[])
    assert vocab.token_ids.tolist() == sorted(ids)
    return write_dflash_gguf(src.tensors, src.config, target, out, outtype="f32", draft_vocab=vocab)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dvocab")
    target = write_tiny_llama(d / "tiny.gguf", n_vocab=64, seed=2)
    full = write_random_drafter(target, d / "full.gguf", taps=[1, 2], block_size=8, n_head=4, n_head_kv=2,
                                head_dim=16, n_ff=64, seed=9)
    ids = [2] + list(range(3, 64, 3))          # eos + every third token
    return target, full, _reduced(target, full, d / "reduced.gguf", ids), ids


def _draft_logits(drafter_path: Path, target: Target, feats: np.ndarray) -> np.ndarray:
    drafter = DFlashSource(Model(drafter_path), target.ctx, SETTINGS, target.model)
    drafter.begin()
    drafter.process(feats, 0)
    logits = drafter.draft(5, feats.shape[0], 7, want_logits=True).logits
    drafter.close()
    return logits


def test_reduced_logits_equal_the_full_head_on_its_tokens(files):
    target_path, full, reduced, ids = files
    target = Target(Model(target_path), SETTINGS, taps=[1, 2], max_verify=8)
    feats = np.random.default_rng(0).standard_normal((20, 2 * target.model.n_embd)).astype(np.float32)
    a, b = _draft_logits(full, target, feats), _draft_logits(reduced, target, feats)
    inside = np.isin(np.arange(a.shape[1]), ids)
    np.testing.assert_allclose(b[:, inside], a[:, inside], rtol=0, atol=1e-4)
    assert np.all(b[:, ~inside] == -np.inf)
    target.close()


def test_head_order_rows_are_the_scattered_rows_bit_for_bit(files):
    """The source reads a reduced vocabulary's logits in head order (the graph no longer fills and scatters
    n_vocab-wide rows): the same floats as the scattered rows' d2t columns, bit for bit, and the same drafts;
    a drafter without d2t keeps the vocabulary's rows. Breaks if the rows come out in another order, if the
    mapping back to tokens is skipped, or if the switch reaches a drafter it must not."""
    target_path, full, reduced, ids = files
    target = Target(Model(target_path), SETTINGS, taps=[1, 2], max_verify=8)
    feats = np.random.default_rng(3).standard_normal((20, 2 * target.model.n_embd)).astype(np.float32)
    source = DFlashSource(Model(reduced), target.ctx, SETTINGS, target.model)
    assert source._d2t is not None and source._d2t.tolist() == sorted(ids)
    source.begin()
    source.process(feats, 0)
    rows = {}
    for head_order in (True, False, True):
        assert source.ctx.set_draft_vocab_logits(head_order)
        assert source.ctx.logit_cols == (len(ids) if head_order else target.model.n_vocab)
        source._d2t = source.driver.model.draft_vocab() if head_order else None
        proposal = source.draft(5, feats.shape[0], 7, want_logits=True)
        source._decode_block(5, feats.shape[0], 8)
        rows[head_order] = (np.array(source.driver.logits(8)), proposal)
        source.driver.drop_block(feats.shape[0])
    (compact, by_head), (wide, by_vocab) = rows[True], rows[False]
    assert compact.shape == (8, len(ids)) and wide.shape == (8, target.model.n_vocab)
    assert np.array_equal(compact, wide[:, sorted(ids)])
    assert by_head.tokens == by_vocab.tokens
    assert np.array_equal(by_head.logits, by_vocab.logits)
    source.close()
    plain = DFlashSource(Model(full), target.ctx, SETTINGS, target.model)
    assert plain._d2t is None and plain.ctx.logit_cols == target.model.n_vocab
    plain.close()
    target.close()


def test_tau_probe_maps_head_order_rows_to_tokens(files):
    """`bench --tau` (NativeDraftProbe) reads a reduced vocabulary's rows in head order too: its drafts are target
    token ids, the engine source's at the same anchors. Breaks if the probe returns head-row indices."""
    from dflash_gguf.bench.tau import NativeDraftProbe
    target_path, _, reduced, ids = files
    probe = NativeDraftProbe(target_path, reduced, n_threads=1)
    settings = ContextSettings(n_ctx=probe.N_CTX, n_batch=64, n_ubatch=64, n_threads=1)
    source = DFlashSource(Model(reduced), probe.tctx, settings, probe.target)
    try:
        assert probe.d2t is not None and probe.d2t.tolist() == sorted(ids)
        seq, feats = probe.continuation([1] + [(5 * i) % 60 + 3 for i in range(30)], 16)
        source.begin()
        held, drafted = 0, []
        for p in (4, 20, len(seq) - 2):
            drafts = probe.draft_at(seq, feats, p)
            source.process(feats[held:p], held)
            held = p
            assert drafts.tolist() == source.draft(seq[p], p, probe.block - 1, want_logits=False).tokens
            drafted += drafts.tolist()
        assert set(drafted) <= set(ids)                 # token ids, not head rows
    finally:
        source.close()
        source.model.close()
        probe.close()


def test_greedy_with_reduced_vocab_matches_plain(files):
    target_path, _, reduced, ids = files
    target = Target(Model(target_path), SETTINGS, taps=[1, 2], max_verify=8)
    drafter = DFlashSource(Model(reduced), target.ctx, SETTINGS, target.model)
    spec = SpecDecoder(target, drafter, DraftLengthPolicy(7, adaptive=False))
    spec.debug_check_positions = True
    plain = SpecDecoder(target, None, DraftLengthPolicy(1, adaptive=False))
    rng = np.random.default_rng(1)
    for _ in range(6):
        prompt = [1] + rng.integers(3, 64, size=12).tolist()
        res = spec.generate(prompt, 64, SamplingParams(), stop_tokens=lambda t: False)
        assert res.tokens == plain.generate(prompt, 64, SamplingParams(), stop_tokens=lambda t: False).tokens
        assert res.n_drafted > 0
    drafter.close()
    target.close()


def test_reconversion_and_inspect_keep_the_vocabulary(files, tmp_path):
    target_path, _, reduced, ids = files
    src = normalize_gguf(reduced, detect_flavour(reduced), TargetFile.open(target_path))
    assert src.draft_vocab is not None and src.draft_vocab.token_ids.tolist() == sorted(ids)
    assert inspect_drafter(reduced)["draft_vocab"] == len(ids)
    again = write_dflash_gguf(src.tensors, src.config, target_path, tmp_path / "again.gguf", outtype="q8_0",
                              draft_vocab=src.draft_vocab)
    assert inspect_drafter(again)["draft_vocab"] == len(ids)


@pytest.mark.parametrize("damage,message", [("duplicate", "same token"), ("range", "outside the target")])
def test_damaged_d2t_is_refused(files, tmp_path, damage, message):
    import gguf
    target_path, _, reduced, _ = files
    r = gguf.GGUFReader(str(reduced))
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "dflash")
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        w.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.name == "d2t":
            data = data.copy()
            data[1] = data[0] if damage == "duplicate" else 10_000
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    finish(w)
    bad = tmp_path / "bad.gguf"
    with pytest.raises(UserError, match=message):
        normalize_gguf(bad, detect_flavour(bad), TargetFile.open(target_path))


@pytest.mark.slow
def test_sampling_with_reduced_vocab_equals_plain(tmp_path):
    """q = 0 outside the draft vocabulary: rejection sampling must still give the target's distribution."""
    target_path = write_tiny_llama(tmp_path / "tiny.gguf", n_vocab=16, seed=5, logit_scale=1.5)
    full = write_random_drafter(target_path, tmp_path / "full.gguf", taps=[1], block_size=4, n_head=4, n_head_kv=2,
                                head_dim=16, n_ff=64, seed=11)
    reduced = _reduced(target_path, full, tmp_path / "reduced.gguf", [2, 3, 5, 7, 8, 12])
    target = Target(Model(target_path), SETTINGS, taps=[1], max_verify=4)
    drafter = DFlashSource(Model(reduced), target.ctx, SETTINGS, target.model)
    sampling = SamplingParams(temperature=1.0, top_k=12)
    prompt = [1, 4, 9, 6]
    expected = exact_second_token_marginal(target, prompt, sampling)
    n = 2500
    counts = np.zeros_like(expected)
    spec = SpecDecoder(target, drafter, DraftLengthPolicy(3, adaptive=False))
    drafted = 0
    for seed in range(n):
        res = spec.generate(prompt, 3, SamplingParams(1.0, 12, seed=seed), stop_tokens=lambda t: False)
        counts[res.tokens[1]] += 1
        drafted += res.n_drafted
    assert drafted >= n                            # t1 came out of speculative verifies
    assert_same_distribution(counts, expected)
    drafter.close()
    target.close()
