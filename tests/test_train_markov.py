"""`train --markov-rank`: a DSpark drafter (the DFlash backbone plus a low-rank Markov head) trained from a target.

Torch only: the head starts as a no-op, is teacher-forced on the target's token before each slot, learns, keeps
untouched W1 rows at zero, and a DFlash or DSpark drafter continues into it. With the native library, on tiny
random targets: `train --markov-rank` harvests, trains and exports a DSpark drafter; the exported GGUF (reduced
draft vocabulary, Q8_0) validates, opens as a DSpark drafter and decodes exactly the plain greedy output;
llama.cpp's chained block logits equal the torch head's chain; W1/W2 shapes are what llama.cpp asks for."""

from contextlib import ExitStack, closing

import numpy as np
import pytest

from dflash_gguf.train.dataset import FeatureDataset
from test_train_data import MASK, _dataset, _random_seqs, _trainer

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

W1, W2 = "markov_head.markov_w1.weight", "markov_head.markov_w2.weight"


def test_the_head_starts_as_a_no_op_and_adds_w2_w1_of_the_targets_previous_token(tmp_path):
    data = _dataset(tmp_path, _random_seqs())
    plain, markov = _trainer(data), _trainer(data, markov_rank=8)
    assert markov.config.family == "DSpark" and markov.config.sample_from_anchor is False
    assert markov.model.markov_head.markov_w2.weight.shape == (40, 8)
    pb = data.blocks(0, 6, 4, MASK, np.random.default_rng(0))
    sd = {k: v for k, v in markov.model.state_dict().items() if not k.startswith("markov_head.")}
    plain.model.load_state_dict(sd)
    with torch.no_grad():
        base, labels, slots = plain.forward(pb)
        torch.testing.assert_close(markov.forward(pb)[0], base)                  # W1 = 0: DFlash at the start
        markov.model.markov_head.markov_w1.weight.normal_()
        logits = markov.forward(pb)[0]
    toks = np.asarray(data.tokens)
    prev = toks[pb.block_pos[pb.slot > 0] - 1]              # the target's token before each row (the anchor first)
    w1, w2 = markov.model.markov_head.markov_w1.weight, markov.model.markov_head.markov_w2.weight
    torch.testing.assert_close(logits - base, w1[torch.as_tensor(prev)] @ w2.t())


def test_the_inference_chain_biases_each_slot_by_the_argmax_before_it(tmp_path):
    from dflash_gguf.drafter.markov import MarkovHead
    head = MarkovHead(n_vocab=12, rank=4, n_columns=5)
    with torch.no_grad():
        head.markov_w1.weight.normal_()
        head.markov_w2.weight.normal_()
    columns = torch.tensor([1, 3, 4, 8, 10])                # a draft vocabulary: column -> target token
    base = torch.randn(3, 5)
    got = head.chain(base, first_prev=7, column_ids=columns)
    prev = 7
    for k in range(3):
        want = base[k] + head.markov_w2.weight @ head.markov_w1.weight[prev]
        torch.testing.assert_close(got[k], want)
        prev = int(columns[int(want.argmax())])


def test_training_learns_the_head_and_leaves_unseen_previous_tokens_at_zero(tmp_path):
    vocab = np.arange(2, 30)                               # the data's tokens are 2..19; W1 rows 20..39 never used
    tr = _trainer(_dataset(tmp_path, _random_seqs()), markov_rank=8, draft_vocab=vocab, rows=1500,
                  anchors_per_seq=8, eval_every=10**9, lr=3e-3)
    tr.train(tmp_path / "ck", progress=False)
    w1 = tr.model.markov_head.markov_w1.weight.detach()
    assert w1[2:20].abs().sum(1).min() > 0 and w1[20:].abs().max() == 0 and w1[:2].abs().max() == 0
    state = tr.state_numpy()                               # W2 over the whole vocabulary, zero outside the draft one
    assert state[W2].shape == (40, 8) and np.abs(state[W2][vocab]).min() > 0
    assert np.abs(state[W2][np.setdiff1d(np.arange(40), vocab)]).max() == 0
    again = _trainer(FeatureDataset(tmp_path), markov_rank=8, draft_vocab=vocab, rows=1500)
    again.resume(tmp_path / "ck")                          # the checkpoint holds the head
    torch.testing.assert_close(again.model.markov_head.markov_w1.weight, tr.model.markov_head.markov_w1.weight)
    from dflash_gguf.errors import UserError
    with pytest.raises(UserError, match="resume it with --markov-rank 8"):
        _trainer(FeatureDataset(tmp_path), draft_vocab=vocab, rows=1500).resume(tmp_path / "ck")


def test_a_dflash_drafter_continues_with_a_no_op_head_and_a_dspark_one_keeps_its_rows(tmp_path):
    from dflash_gguf.errors import UserError
    data = _dataset(tmp_path, _random_seqs())
    vocab = np.arange(2, 30)
    dflash = _trainer(data).state_numpy()
    tr = _trainer(data, markov_rank=8, draft_vocab=vocab)
    tr.load_weights(dflash, "dflash.gguf")
    assert tr.model.markov_head.markov_w1.weight.abs().max() == 0
    torch.testing.assert_close(tr.model.fc.weight, torch.as_tensor(dflash["fc.weight"]))
    dspark = dict(dflash)
    dspark[W1] = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    dspark[W2] = np.random.default_rng(1).standard_normal((40, 8)).astype(np.float32)   # over the whole vocabulary
    tr.load_weights(dspark, "dspark.gguf")
    np.testing.assert_array_equal(tr.model.markov_head.markov_w2.weight.detach().numpy(), dspark[W2][vocab])
    with pytest.raises(UserError, match="--markov-rank"):
        _trainer(data, markov_rank=4, draft_vocab=vocab).load_weights(dspark, "dspark.gguf")


# -- through llama.cpp ---------------------------------------------------------------------------------------
def test_the_train_command_with_a_markov_rank_writes_a_dspark_drafter(tmp_path):
    """harvest → train → export on a tiny target (a few seconds): the option reaches the trainer and the file."""
    import json

    from typer.testing import CliRunner

    from dflash_gguf.cli import app
    from dflash_gguf.convert.inspect_drafter import inspect_drafter
    from helpers.engine import write_tiny_llama
    target = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=64, text=True, seed=3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "chat", "format": "completion",
                                                           "prompt": f"t{i % 29 + 3} t{i * 7 % 29 + 3}"}) + "\n"
                               for i in range(16)))
    out = tmp_path / "dspark.gguf"
    res = CliRunner().invoke(app, [
        "train", "-m", str(target), "-o", str(out), "--prompts", str(prompts), "--layers", "1",
        "--block-size", "4", "--taps", "1,3", "--tokens", "0", "--rows", "300", "--markov-rank", "32",
        "--draft-vocab", "40", "-t", "1", "--parallel", "4", "--work-dir", str(tmp_path / "work"),
        "--data-dir", str(tmp_path / "data")])
    assert res.exit_code == 0, res.output
    report = inspect_drafter(out, target)
    assert (report["family"], report["markov_rank"], report["sample_from_anchor"], report["draft_vocab"]) == \
        ("DSpark", 32, False, 40)
    assert report["training"]["markov_rank"] == 32
    assert json.loads(report["training"]["train_settings"])["markov_rank"] == 32


H, TAPS, N_VOCAB = 64, [1, 3], 128     # big enough for the Markov tensors to be quantized at Q8_0
EXACT = dict(n_ctx=128, n_batch=64, n_ubatch=64, n_threads=1, type_k="f32", type_v="f32", flash_attn="off")


def _tiny_dspark(tmp_path, **settings):
    """(target, trainer, draft vocabulary): a tiny target, a dataset of its shape, a DSpark trainer with an
    80-token draft vocabulary after a few steps, its Markov head then made large enough to change drafts (a few
    steps leave it small)."""
    rank, k = 64, 80
    from dflash_gguf.drafter import draft_vocab as dv
    from dflash_gguf.target_file import TargetFile
    from dflash_gguf.train.harvest import DatasetWriter
    from dflash_gguf.train.pipeline import drafter_config
    from dflash_gguf.train.frozen_weights import embedding_and_head
    from dflash_gguf.train.trainer import Trainer, TrainSettings
    from helpers.engine import write_tiny_llama
    target = write_tiny_llama(tmp_path / "target.gguf", n_vocab=N_VOCAB, n_embd=H, n_layer=3, seed=4)
    rng = np.random.default_rng(0)
    w = DatasetWriter(tmp_path / "data", {"target": "t.gguf", "taps": TAPS, "n_embd": H, "store_features": True,
                                          "top_k_probs": 0})
    for i in range(21):
        toks = rng.integers(3, N_VOCAB, size=40)
        w.add(toks.tolist(), [[4, 40]], {"category": "chat"}, prompt_index=i, sampled=False,
              feats=rng.standard_normal((40, len(TAPS) * H)))
    data = FeatureDataset(tmp_path / "data")
    info = TargetFile.open(target)
    config = drafter_config(info, TAPS, n_layers=1, block_size=8)
    embed, head = embedding_and_head(info)
    counts = np.bincount(data.written_tokens(), minlength=N_VOCAB)
    vocab = dv.build(info, counts, k, [])
    settings = TrainSettings(n_layers=1, block_size=8, rows=700, anchors_per_seq=8, eval_every=10**9,
                             init_from_target=False, markov_rank=rank, **settings)
    tr = Trainer(data, config, embed, head, settings, draft_vocab=vocab.token_ids)
    tr.arch = info.arch
    tr.train(tmp_path / "ck", progress=False)
    with torch.no_grad():
        tr.model.markov_head.markov_w1.weight.normal_(0, 1.0)
        tr.model.markov_head.markov_w2.weight.normal_(0, 0.3)
    return target, tr, vocab


@pytest.fixture(scope="module")
def dspark(tmp_path_factory):
    return _tiny_dspark(tmp_path_factory.mktemp("dspark"))


def _export(tmp_path, target, tr, vocab, outtype):
    from dflash_gguf.target_file import TargetFile
    from dflash_gguf.train.pipeline import export
    out = tmp_path / f"dspark-{outtype}.gguf"
    with TargetFile.open(target) as tf:
        export(tr, tf, out, {"labelled_rows": tr.rows_seen, "markov_rank": tr.config.markov_rank}, vocab,
               outtype=outtype)
    return out


def test_a_trained_markov_drafter_validates_opens_as_dspark_and_decodes_like_plain_greedy(tmp_path, dspark):
    from dflash_gguf.convert.inspect_drafter import inspect_drafter
    from dflash_gguf.engine.sources import open_drafter
    from dflash_gguf.engine.sources.dspark import DSparkSource
    from dflash_gguf.engine.loop import SpecDecoder
    from dflash_gguf.engine.policy import DraftLengthPolicy
    from dflash_gguf.engine.target import Target
    from dflash_gguf.gguf_check import check_drafter, check_family
    from dflash_gguf.native.wrappers import ContextSettings, Model
    target, tr, vocab = dspark
    out = _export(tmp_path, target, tr, vocab, "q8_0")       # the writer load-checks it in llama.cpp too
    assert check_family(check_drafter(out, target)).name == "DSpark"
    report = inspect_drafter(out, target)
    assert report["family"] == "DSpark" and report["markov_rank"] == 64 and report["sample_from_anchor"] is False
    assert report["draft_vocab"] == 80 and report["training"]["markov_rank"] == 64 and report["fits_target"]

    cs = ContextSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    tm = Model(target)
    tgt = Target(tm, cs, taps=TAPS, max_verify=8)
    drafter = open_drafter(Model(out), tgt.ctx, cs, tm)
    assert isinstance(drafter, DSparkSource) and not drafter.anchor_first
    plain = SpecDecoder(tgt, None, DraftLengthPolicy(1, adaptive=False))
    spec = SpecDecoder(tgt, drafter, DraftLengthPolicy(7, adaptive=False))
    spec.debug_check_positions = True
    for prompt in ([1, 7, 9, 11], [1, 30, 4, 4, 52]):
        ref = plain.generate(prompt, 40, stop_tokens=lambda t: False)
        res = spec.generate(prompt, 40, stop_tokens=lambda t: False)
        assert res.tokens == ref.tokens and res.n_drafted > 0


def _llama_cpp_block(target, drafter_path, feats, block):
    from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model
    with ExitStack() as st:
        tm = st.enter_context(closing(Model(target)))
        dm = st.enter_context(closing(Model(drafter_path)))
        tc = st.enter_context(closing(Context(tm, ContextSettings(**EXACT))))
        dc = st.enter_context(closing(Context(dm, ContextSettings(**EXACT), other=tc)))
        dc.set_causal(False)
        eb = st.enter_context(closing(Batch(dm.native, len(feats), feats.shape[1])))
        eb.set_embd(feats, 0, "none")
        dc.decode(eb)
        tb = st.enter_context(closing(Batch(dm.native, len(block))))
        tb.set_tokens(block, len(feats), "all")
        dc.decode(tb)
        return np.array(dc.logits_all(len(block)))


@pytest.mark.parametrize("outtype, tol", [("f32", 1e-3), ("q8_0", 0.15)])
def test_llama_cpp_chains_the_head_as_torch_does(tmp_path, dspark, outtype, tol):
    target, tr, vocab = dspark
    out = _export(tmp_path, target, tr, vocab, outtype)
    feats = np.random.default_rng(1).standard_normal((24, len(TAPS) * H)).astype(np.float32)
    block = [17] + [tr.config.mask_token_id] * 7
    got = _llama_cpp_block(target, out, feats, block)         # [8, V]: row 0 the anchor, rows 1..7 the drafts
    ids = torch.as_tensor(vocab.token_ids)
    with torch.no_grad():
        m = tr.model.float()
        h = m(tr.embed[torch.tensor(block)][None], torch.tensor(feats)[None], torch.arange(24, 32)[None],
              torch.arange(24)[None])[0]
        base = h @ tr.head.t()                                # [8, K] over the draft vocabulary
        want = m.markov_head.chain(base[1:], first_prev=block[0], column_ids=ids).numpy()
        anchor_only = (base[1:] + m.markov_head.bias(torch.tensor([block[0]]))).numpy()   # a chain that never moves
    ours = got[1:, vocab.token_ids]
    assert np.isneginf(np.delete(got, vocab.token_ids, axis=1)).all()
    # power: the head changes the drafts, and the tokens it conditions on change along the block
    assert (want.argmax(1) != base[1:].numpy().argmax(1)).any() and len(set(want.argmax(1))) >= 2
    assert np.abs(anchor_only - want).max() > 1.0
    assert np.abs(ours - want).max() <= tol, np.abs(ours - want).max()
    np.testing.assert_array_equal(ours.argmax(1), want.argmax(1))
    np.testing.assert_allclose(got[0, vocab.token_ids], base[0].numpy(), atol=tol)    # the anchor row: no bias


@pytest.mark.parametrize("outtype, tol", [("f32", 1e-3), ("q8_0", 0.15)])
def test_the_engine_chains_the_head_over_the_draft_vocabulary_as_torch_does(tmp_path, dspark, outtype, tol):
    """On the CPU the engine runs the chain itself, over the draft vocabulary (d2t) with W1/W2 read from the
    file: its drafts and chained logits equal the torch head's chain, -inf outside the draft vocabulary."""
    from dflash_gguf.engine.sources.dspark import DSparkSource
    from dflash_gguf.native.wrappers import Context, ContextSettings, Model
    target, tr, vocab = dspark
    out = _export(tmp_path, target, tr, vocab, outtype)
    feats = np.random.default_rng(1).standard_normal((24, len(TAPS) * H)).astype(np.float32)
    cs = ContextSettings(**EXACT)
    with ExitStack() as st:
        tm = st.enter_context(closing(Model(target)))
        tc = st.enter_context(closing(Context(tm, cs)))
        drafter = st.enter_context(closing(DSparkSource(Model(out), tc, cs, tm)))
        assert drafter.markov is not None and len(drafter.markov.columns) == len(vocab.token_ids)
        drafter.begin()
        drafter.process(feats, 0)
        proposal = drafter.draft(17, 24, 7, want_logits=True)
    ids = torch.as_tensor(vocab.token_ids)
    with torch.no_grad():
        m = tr.model.float()
        block = [17] + [tr.config.mask_token_id] * 7
        h = m(tr.embed[torch.tensor(block)][None], torch.tensor(feats)[None], torch.arange(24, 32)[None],
              torch.arange(24)[None])[0]
        want = m.markov_head.chain((h @ tr.head.t())[1:], first_prev=17, column_ids=ids).numpy()
    ours = proposal.logits[:, vocab.token_ids]
    assert np.isneginf(np.delete(proposal.logits, vocab.token_ids, axis=1)).all()
    assert np.abs(ours - want).max() <= tol, np.abs(ours - want).max()
    assert proposal.tokens == [int(vocab.token_ids[j]) for j in want.argmax(1)]


def test_w1_spans_the_vocabulary_w2_the_draft_one_and_the_file_reads_back(tmp_path, dspark):
    """llama.cpp indexes W1 by any target token (create_tensor {rank, n_vocab}) and W2 gives one bias per head
    row ({rank, n_vocab_draft}); the validator asks the same, and our reader/writer round-trip the pair."""
    from dflash_gguf.convert.checkpoint_formats import read_source
    from dflash_gguf.target_file import TargetFile
    from dflash_gguf.convert.writer import write_dflash_gguf
    from dflash_gguf.gguf_check import BadModelFile, check_drafter, parse_header
    from test_dflash_family import _rewrite
    target, tr, vocab = dspark
    out = _export(tmp_path, target, tr, vocab, "f32")
    for name, cut in (("markov_w1.weight", lambda a: a[:80].copy()), ("markov_w2.weight", lambda a: a[:40].copy())):
        bad = _rewrite(out, tmp_path / f"bad-{name}.gguf", reshape={name: cut})
        with pytest.raises(BadModelFile, match=name):
            check_drafter(bad, target)
    src = read_source(str(out), TargetFile.open(target))
    state = tr.state_numpy()
    assert src.config.family == "DSpark" and src.config.markov_rank == 64 and src.config.sample_from_anchor is False
    np.testing.assert_array_equal(src.draft_vocab.token_ids, vocab.token_ids)
    for name in (W1, W2):                                    # W2 back over the whole vocabulary, zero outside
        np.testing.assert_array_equal(src.tensors[name], state[name])
    again = write_dflash_gguf(src.tensors, src.config, target, tmp_path / "again.gguf", outtype="f32",
                              draft_vocab=src.draft_vocab)
    dims = {t.name: t.dims for t in parse_header(again).tensors}
    assert dims["markov_w1.weight"] == (64, N_VOCAB) and dims["markov_w2.weight"] == (64, 80)


def test_a_trained_confidence_head_exports_and_llama_cpp_computes_it_as_torch_does(tmp_path):
    """`--confidence-head`: the file carries conf_proj (validated, inspect names it), and llama.cpp's graph
    computes each draft slot's confidence from the hidden state and W1 of the token drafted before it, as the
    trainer's head does."""
    from dflash_gguf.convert.inspect_drafter import inspect_drafter
    from dflash_gguf.engine.sources.dspark import DSparkSource
    from dflash_gguf.native.wrappers import Context, ContextSettings, Model
    target, tr, vocab = _tiny_dspark(tmp_path, confidence_head=True)
    with torch.no_grad():                       # a head that says something: not the few steps' near-constant
        tr.model.confidence_head.proj.weight.normal_(0, 0.3)
    out = _export(tmp_path, target, tr, vocab, "f32")
    report = inspect_drafter(out, target)
    assert report["family"] == "DSpark" and report["confidence_head"] is True
    feats = np.random.default_rng(1).standard_normal((24, len(TAPS) * H)).astype(np.float32)
    cs = ContextSettings(**EXACT)
    with ExitStack() as st:
        tm = st.enter_context(closing(Model(target)))
        tc = st.enter_context(closing(Context(tm, cs)))
        drafter = st.enter_context(closing(DSparkSource(Model(out), tc, cs, tm, markov_in_graph=True)))
        drafter.ctx.enable_nextn()
        drafter.begin()
        drafter.process(feats, 0)
        proposal = drafter.draft(17, 24, 7, want_logits=False)
        got = np.array(drafter.ctx.nextn_rows(8)[1:, 0])         # bonus-anchor layout: rows 1..7 are the drafts
    with torch.no_grad():
        m = tr.model.float()
        block = [17] + [tr.config.mask_token_id] * 7
        h = m(tr.embed[torch.tensor(block)][None], torch.tensor(feats)[None], torch.arange(24, 32)[None],
              torch.arange(24)[None])[0]
        before = torch.tensor([17] + proposal.tokens[:-1])
        want = m.confidence_head(h[1:], m.markov_head.markov_w1(before)).numpy()
    assert want.std() > 0.01                                        # power: the confidences differ by slot
    np.testing.assert_allclose(got, want, atol=1e-4)
