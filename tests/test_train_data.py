"""Training data at scale: multi-turn spans, the target's top-k kept for distillation, a harvest that resumes
without duplicates, draft-vocabulary loss columns, the distillation targets, precision choice, and rows-based
resume. The native tests use a tiny random llama target."""

import json
import math

import numpy as np
import pytest

from dflash_gguf.train.dataset import FeatureDataset
from dflash_gguf.train.harvest import DatasetWriter, top_k_probs
from dflash_gguf.train.precision import autocast_dtype_name

H, TAPS, V, MASK, K = 16, [1, 2], 40, 1, 4


def _dataset(folder, seqs, top_k=K):
    """seqs: (tokens, spans); features random, top-k rows = the next token first with p 0.7."""
    meta = {"target": "t.gguf", "taps": TAPS, "n_embd": H, "store_features": True, "top_k_probs": top_k}
    w = DatasetWriter(folder, meta)
    rng = np.random.default_rng(0)
    for i, (tokens, spans) in enumerate(seqs):
        n = len(tokens)
        ids = np.full((n, top_k), -1)
        p = np.zeros((n, top_k))
        ids[:-1, 0], p[:-1, 0] = tokens[1:], 0.7
        ids[:-1, 1], p[:-1, 1] = (np.asarray(tokens[1:]) + 1) % V, 0.2
        w.add(tokens, spans, {"category": "chat"}, prompt_index=i, sampled=False,
              feats=rng.standard_normal((n, len(TAPS) * H)), topk_ids=ids, topk_p=p)
    return FeatureDataset(folder)


def test_blocks_stay_inside_target_written_spans_and_carry_the_teacher_of_their_label(tmp_path):
    toks = list(range(2, 38))
    data = _dataset(tmp_path, [(toks, [[5, 15], [22, 36]])])
    pb = data.blocks(0, n_anchors=50, block_size=4, mask_token=MASK, rng=np.random.default_rng(1))
    anchors = pb.block_pos[pb.slot == 0]
    assert set(anchors.tolist()) == set(range(5, 12)) | set(range(22, 33))      # every fitting anchor, no other
    rows = pb.slot > 0
    np.testing.assert_array_equal(pb.teacher_ids[rows, 0], pb.labels[rows])    # kept at p-1 for the token at p
    assert np.allclose(pb.teacher_p[rows, 0], 0.7, atol=1e-3)


def test_writer_resumes_by_prompt_and_drops_a_half_written_tail(tmp_path):
    data = _dataset(tmp_path, [(list(range(2, 30)), [[4, 28]])] * 2)
    with open(tmp_path / "feats.bin", "ab") as f:         # killed while appending the next sequence
        f.write(np.zeros(3 * len(TAPS) * H, np.float16).tobytes())
    w = DatasetWriter(tmp_path, data.meta)
    assert w.done == {0, 1} and w.offset == 56
    assert (tmp_path / "feats.bin").stat().st_size == 56 * len(TAPS) * H * 2
    with pytest.raises(ValueError, match="seed"):
        DatasetWriter(tmp_path, data.meta | {"seed": 7})


def test_top_k_probs_are_the_largest_softmax_entries_in_order():
    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    ids, p = top_k_probs(logits, 5)
    full = np.exp(logits - logits.max(1, keepdims=True))
    full /= full.sum(1, keepdims=True)
    np.testing.assert_array_equal(ids, np.argsort(-full, axis=1)[:, :5])
    np.testing.assert_allclose(p, np.take_along_axis(full, ids, 1), rtol=1e-5)


def test_precision_is_bf16_only_where_the_hardware_has_it():
    assert autocast_dtype_name("cpu", flags={"avx2", "fma", "f16c"}, override="") is None
    assert autocast_dtype_name("cpu", flags={"avx512f", "avx512_bf16"}, override="") == "bfloat16"
    assert autocast_dtype_name("cpu", flags={"amx_bf16"}, override="") == "bfloat16"
    assert autocast_dtype_name("cuda", cuda_bf16=True, override="") == "bfloat16"
    assert autocast_dtype_name("cuda", cuda_bf16=False, override="") is None
    assert autocast_dtype_name("cpu", flags={"avx2"}, override="bf16") == "bfloat16"
    with pytest.raises(ValueError, match="fp32 or bf16"):
        autocast_dtype_name("cpu", flags=set(), override="fp16")


def _trainer(data, **settings):
    pytest.importorskip("torch")
    from dflash_gguf.drafter.config import DrafterConfig
    from dflash_gguf.train.trainer import Trainer, TrainSettings
    rng = np.random.default_rng(3)
    cfg = DrafterConfig(hidden_size=H, intermediate_size=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                        target_layers=TAPS, block_size=4, mask_token_id=MASK, vocab_size=V)
    embed = rng.standard_normal((V, H)).astype(np.float32)
    head = rng.standard_normal((V, H)).astype(np.float32)
    vocab = settings.pop("draft_vocab", None)
    return Trainer(data, cfg, embed, head, TrainSettings(n_layers=1, block_size=4, **settings), draft_vocab=vocab)


def _random_seqs(n=21, length=40):
    rng = np.random.default_rng(5)
    return [(rng.integers(2, 20, size=length).tolist(), [[8, length]]) for _ in range(n)]


def test_draft_vocabulary_loss_uses_exactly_its_columns_and_ignores_other_labels(tmp_path):
    import torch
    vocab = np.arange(2, 12)                              # labels 12..19 cannot be proposed
    tr = _trainer(_dataset(tmp_path, _random_seqs()), draft_vocab=vocab)
    full = _trainer(_dataset(tmp_path / "b", _random_seqs()))
    full.model.load_state_dict(tr.model.state_dict())
    pb = tr.data.blocks(0, 6, 4, MASK, np.random.default_rng(0))
    with torch.no_grad():
        logits, labels, slots = tr.forward(pb)
        all_logits, all_labels, _ = full.forward(pb)
    torch.testing.assert_close(logits, all_logits[:, torch.as_tensor(vocab)])
    inside = (all_labels >= 2) & (all_labels < 12)
    assert torch.equal(labels[inside] + 2, all_labels[inside]) and bool((labels[~inside] == -100).all())
    manual = torch.nn.functional.cross_entropy(logits[inside], labels[inside], reduction="none")
    w = tr.weights[slots[inside]]
    torch.testing.assert_close(tr.loss(logits, labels, slots), (manual * w).sum() / w.sum())


def test_distillation_targets_are_the_renormalised_top_k_and_change_the_loss(tmp_path):
    import torch
    tr = _trainer(_dataset(tmp_path, _random_seqs()), distill=0.5)
    pb = tr.data.blocks(0, 6, 4, MASK, np.random.default_rng(0))
    soft = tr.teacher(pb)
    rows = pb.slot > 0
    assert soft.shape == (rows.sum(), V)
    torch.testing.assert_close(soft.sum(1), torch.ones(len(soft)))
    labels = torch.as_tensor(pb.labels[rows])
    torch.testing.assert_close(soft[torch.arange(len(soft)), labels], torch.full((len(soft),), 0.7 / 0.9),
                               atol=1e-3, rtol=0)                  # stored as float16
    with torch.no_grad():
        out = tr.forward(pb)
        assert not torch.isclose(tr.loss(*out, soft), tr.loss(*out))


def test_training_resumes_at_the_rows_it_had_seen(tmp_path):
    tr = _trainer(_dataset(tmp_path, _random_seqs()), rows=3000, seqs_per_step=2, anchors_per_seq=8, eval_every=5)
    tr.total_rows = 1                                     # interrupted after the first step
    tr.train(tmp_path / "ck", progress=False)
    seen = tr.rows_seen
    assert 0 < seen < 3000
    again = _trainer(FeatureDataset(tmp_path), rows=3000, seqs_per_step=2, anchors_per_seq=8, eval_every=5)
    again.resume(tmp_path / "ck")
    assert again.rows_seen == seen and again.step == tr.step
    again.train(tmp_path / "ck", progress=False)
    assert again.rows_seen >= 3000
    history = json.loads((tmp_path / "ck" / "history.json").read_text())
    assert [h["step"] for h in history] == list(range(1, again.step + 1))
    assert all(h["rows_per_s"] > 0 for h in history)


def test_training_can_stop_at_a_snapshot_and_go_on_under_the_same_schedule(tmp_path):
    tr = _trainer(_dataset(tmp_path, _random_seqs()), rows=3000, anchors_per_seq=8, eval_every=10**9)
    lr_mid = tr.lr_at(1500)
    tr.train(tmp_path / "ck", progress=False, stop_at=1000)
    assert 1000 <= tr.rows_seen < 1200 and tr.total_rows == 3000
    assert tr.lr_at(1500) == lr_mid                        # the cosine still runs over the whole budget
    first = tr.step
    tr.train(tmp_path / "ck", progress=False)
    assert tr.rows_seen >= 3000 and tr.step > first


@pytest.mark.slow
def test_harvest_multi_turn_topk_and_resume_on_a_tiny_target(tmp_path):
    from dflash_gguf.native.wrappers import Model
    from dflash_gguf.target_file import TargetFile
    from dflash_gguf.train.harvest import HarvestSettings, harvest
    from helpers.engine import write_tiny_llama
    target = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=64, text=True, seed=3)
    rows = [{"category": "chat", "format": "completion", "prompt": f"t{i % 29 + 3} t{(i * 7) % 29 + 3}"}
            for i in range(12)]                                   # completions: the tiny vocabulary has no template
    settings = HarvestSettings(taps=[1, 3], n_parallel=4, ctx_per_seq=128, max_new={"chat": 12}, n_threads=2,
                               sampled_fraction=0.5, top_k_probs=K)
    with TargetFile.open(target) as tf:
        first = harvest(tf, rows, tmp_path / "d", settings, max_tokens=60)
        assert 0 < len(first.done) < 12
        harvest(tf, rows, tmp_path / "d", settings, prompt_range=(0, 9))     # resumes, within its range
        assert sorted(r["prompt_index"] for r in FeatureDataset(tmp_path / "d").index) == list(range(9))
        harvest(tf, rows, tmp_path / "d", settings)                # resumes: each prompt exactly once
    data = FeatureDataset(tmp_path / "d")
    assert sorted(r["prompt_index"] for r in data.index) == list(range(12))
    model = Model(target)
    for r in data.index:
        (s, e), off = r["spans"][0], r["offset"]
        assert data.feats.shape[0] >= off + r["length"] and e > s
        if not r["sampled"]:                                      # greedy: each written token is the top-1
            np.testing.assert_array_equal(data.topk_ids[off + s - 1:off + e - 1, 0], data.tokens[off + s:off + e])
        assert (data.topk_ids[off:off + s - 1] == -1).all()      # the prompt was not written by the target
        p = data.topk_p[off + s - 1:off + e - 1].astype(np.float64)
        assert (np.diff(p, axis=1) <= 1e-3).all() and (p.sum(1) <= 1.001).all()
    assert all(model.tokenize(rows[r["prompt_index"]]["prompt"], add_special=True)
               == data.tokens[r["offset"]:r["offset"] + r["spans"][0][0]].tolist() for r in data.index)


EVAL = __import__("pathlib").Path(__file__).resolve().parent.parent.parent / "shared" / "prompts"


def _eval_prompts():
    files = sorted(EVAL.glob("*.jsonl"))
    assert files, f"{EVAL}: the evaluation prompts must be beside the repository (../shared/prompts)"
    return [json.loads(x)["prompt"] for f in files for x in f.read_text().splitlines() if x.strip()]


def test_shipped_prompt_set_is_large_diverse_licensed_and_never_overlaps_the_evaluation_prompts():
    from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS
    from dflash_gguf.corpus.prompts import load
    from lab.corpus.overlap import EvalFilter
    rows = load(DEFAULT_PROMPTS)
    assert len(rows) >= 20000 and len({r["prompt"] for r in rows}) == len(rows)
    assert {r["category"] for r in rows} == {"code", "math", "chat"}
    assert all(r["licence"] and r["source"] and r["format"] in ("completion", "chat") for r in rows)
    templates = sum(r["source"].startswith("template:") for r in rows)
    assert templates / len(rows) < 0.15                                   # templates are a small share
    assert len({r["source"].split(":")[0] for r in rows}) >= 30           # many distinct sources
    assert sum(bool(r.get("followups")) for r in rows) >= 1000            # multi-turn
    filt = EvalFilter(_eval_prompts())
    assert not [r["prompt"][:80] for r in rows if filt.overlaps(r["prompt"])]


def test_everyday_mix_is_what_its_script_writes_and_never_overlaps_the_evaluation_prompts(tmp_path):
    import subprocess
    import sys

    from dflash_gguf.corpus.prompts import DATA, DEFAULT_PROMPTS, TRAINED_PART, load
    from lab.corpus.overlap import EvalFilter
    shipped = DATA / "everyday-mix.jsonl.gz"
    rows = load(shipped)
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    out = tmp_path / "mix.jsonl"
    subprocess.run([sys.executable, str(root / "lab" / "make_everyday_mix.py"), "--out", str(out), "--eval", str(EVAL)],
                   check=True, capture_output=True)
    assert load(out) == rows                                              # reproducible from the seeded script
    assert len({r["prompt"] for r in rows}) == len(rows)
    assert all(r["licence"] and r["source"] and r["format"] in ("completion", "chat") for r in rows)
    everyday = [r for r in rows if r["source"].startswith("everyday:")]
    stories = [r for r in rows if r["source"].startswith("template:story")]
    assert len(everyday) >= 2000 and len(stories) >= 300
    trained_part = {r["prompt"] for r in load(DEFAULT_PROMPTS)[:TRAINED_PART]}
    replay = [r for r in rows if not r["source"].startswith(("everyday:", "template:story"))]
    assert replay and all(r["prompt"] in trained_part for r in replay)    # replay only from what it was trained on
    filt = EvalFilter(_eval_prompts())
    assert not [r["prompt"][:80] for r in rows if filt.overlaps(r["prompt"])]


def test_the_overlap_filter_finds_an_evaluation_prompt_inside_other_text():
    from lab.corpus.overlap import EvalFilter
    evals = _eval_prompts()
    filt = EvalFilter(evals)
    assert filt.overlaps("Please help: " + evals[3][:200] + " Thanks.")
    assert filt.overlaps(evals[-1].upper())
    assert not filt.overlaps("How do I use the tar command to unpack an archive into another folder?")


def test_two_writers_on_one_folder_interleave_without_overlap(tmp_path):
    meta = {"target": "t.gguf", "taps": TAPS, "n_embd": H, "store_features": True, "top_k_probs": 0}
    a, b = DatasetWriter(tmp_path, meta), DatasetWriter(tmp_path, meta)      # two harvest shards
    for i in range(6):
        w, n = (a, 10 + i) if i % 2 == 0 else (b, 7 + i)
        w.add(list(range(n)), [[2, n]], {}, prompt_index=i, sampled=False,
              feats=np.full((n, len(TAPS) * H), i, np.float32))
    data = FeatureDataset(tmp_path)
    assert [r["prompt_index"] for r in data.index] == list(range(6))
    for i, r in enumerate(data.index):
        assert data.tokens[r["offset"]:r["offset"] + r["length"]].tolist() == list(range(r["length"]))
        assert (np.asarray(data.feats[r["offset"]:r["offset"] + r["length"]]) == i).all()
    assert DatasetWriter(tmp_path, meta).done == set(range(6))


def test_scaling_fits_recover_known_curves_and_say_where_a_tau_is_reached():
    from lab.scaling import alpha_from_tau, extrapolate, tau_from_alpha
    for alpha in (0.05, 0.3, 0.68, 0.9):
        assert abs(alpha_from_tau(tau_from_alpha(alpha)) - alpha) < 1e-6
    line = [{"rows": 10 ** k, "tau": 1.0 + 0.5 * (k - 3)} for k in (3, 4, 5, 6)]       # τ = 1 + 0.5 per decade
    rep = extrapolate(line, rows_per_s=100.0)
    assert abs(rep["fit"]["b_per_decade"] - 0.5) < 1e-6
    assert abs(rep["reach"]["3.0"]["rows"] - 1e7) / 1e7 < 1e-3
    assert abs(rep["reach"]["3.0"]["cpu_hours"] - 1e7 / 100 / 3600) < 0.1
    flat = extrapolate([{"rows": 10 ** k, "tau": 1.2} for k in (3, 4, 5)], rows_per_s=1.0)
    assert flat["reach"]["3.0"] is None and flat["reach_acceptance_model"]["3.0"] is None


def test_the_fitted_recipe_is_the_one_whose_largest_run_measured_best():
    from lab.scaling import best_compute_series
    points = [{"series": "compute", "rows": 10 ** 6, "tau": 1.2}, {"series": "compute", "rows": 10 ** 4, "tau": 1.05},
              {"series": "compute, small steps", "rows": 10 ** 5, "tau": 1.3},
              {"series": "compute, small steps", "rows": 10 ** 4, "tau": 1.4},   # not its largest run
              {"series": "diversity", "rows": 10 ** 7, "tau": 2.0}]              # not a compute series
    assert best_compute_series(points) == "compute, small steps"
    points[0]["tau"] = 1.35
    assert best_compute_series(points) == "compute"


def test_first_error_cut_keeps_each_block_up_to_its_first_wrong_slot():
    torch = pytest.importorskip("torch")
    from dflash_gguf.train.objective import rows_up_to_first_error
    # three blocks: slots 1..3 (wrong at 2), 1..2 (wrong at 1), 1..3 (all right); short blocks included
    slots = torch.tensor([1, 2, 3, 1, 2, 1, 2, 3])
    correct = torch.tensor([True, False, True, False, True, True, True, True])
    kept = rows_up_to_first_error(correct, slots)
    assert kept.tolist() == [1, 1, 0, 1, 0, 1, 1, 1]


def test_total_variation_share_is_one_minus_the_expected_acceptance():
    torch = pytest.importorskip("torch")
    from dflash_gguf.train.objective import row_losses
    logp = torch.log_softmax(torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.0, 3.0]]), -1)
    soft = torch.tensor([[0.6, 0.4, 0.0], [0.1, 0.1, 0.8]])
    labels = torch.tensor([0, 2])
    q = logp.exp()
    accept = torch.minimum(q, soft).sum(-1)                       # chance a draw from q survives rejection
    hard = -logp[torch.arange(2), labels]
    torch.testing.assert_close(row_losses(logp, labels, soft, tv=1.0), 1 - accept)
    torch.testing.assert_close(row_losses(logp, labels, soft, tv=0.9), 0.1 * hard + 0.9 * (1 - accept))
    torch.testing.assert_close(row_losses(logp, labels, soft), hard)


def test_cut_and_supervised_slots_change_which_rows_carry_loss(tmp_path):
    import torch
    data = _dataset(tmp_path, _random_seqs())
    plain = _trainer(data)
    assert plain.weights.tolist()[0] == 0 and min(plain.weights.tolist()[1:]) > 0
    first_only = _trainer(data, supervised_slots=1)
    assert first_only.weights.tolist()[2:] == [0, 0]
    cut = _trainer(data, cut_at_first_error=True)
    cut.model.load_state_dict(plain.model.state_dict())
    pb = plain.data.blocks(0, 6, 4, MASK, np.random.default_rng(0))
    with torch.no_grad():
        logits, labels, slots = plain.forward(pb)
    right = logits.argmax(-1) == labels
    kept = torch.ones(len(slots), dtype=torch.bool)
    for i in range(len(slots)):                                   # after a wrong row, the rest of its block goes
        if slots[i] > 1 and (not kept[i - 1] or not right[i - 1]):
            kept[i] = False
    w = plain.weights[slots] * kept * (labels >= 0)
    manual = torch.nn.functional.cross_entropy(logits, labels.clamp(min=0), reduction="none")
    torch.testing.assert_close(cut.loss(logits, labels, slots), (manual * w).sum() / w.sum())
    assert not kept.all()                                          # a random drafter is wrong somewhere



def test_a_time_schedule_with_a_rows_cap_ends_at_the_rows_when_they_come_first(tmp_path):
    # train --adapt --rows: on a fast (idle) machine the time box would train more, and more steps on a few
    # hundred recorded requests lowered tau on unseen prompts (docs/learning.md); the rows end it instead
    tr = _trainer(_dataset(tmp_path, _random_seqs()), rows=400, anchors_per_seq=8, eval_every=10**9,
                  schedule_seconds=600.0, warmup=0.1, schedule_rows_cap=True)
    half = pytest.approx(tr.s.lr * 0.5 * (1 + math.cos(math.pi * 0.4 / 0.9)))    # half-way, warm-up 10 %
    assert tr.lr_at(200, 1.0) == half and tr.lr_at(0, 300.0) == half and tr.lr_at(200, 300.0) == half
    assert tr.lr_at(400, 1.0) == 0.0                            # the further along of rows and seconds counts
    tr.train(tmp_path / "ck", progress=False)
    assert 400 <= tr.rows_seen < 400 + 8 * 3 + 1 and tr.seconds_before < 600.0     # the rows ended it
    time_only = _trainer(_dataset(tmp_path / "b", _random_seqs()), rows=400, anchors_per_seq=8, eval_every=10**9,
                         schedule_seconds=600.0, warmup=0.1)
    assert time_only.lr_at(400, 1.0) > 0.0                      # without the cap the rows do not move the schedule


def test_a_time_schedule_warms_up_decays_and_ends_training_when_its_seconds_are_spent(tmp_path):
    tr = _trainer(_dataset(tmp_path, _random_seqs()), rows=10**9, anchors_per_seq=8, eval_every=10**9,
                  schedule_seconds=2.0, warmup=0.1)
    lrs = [tr.lr_at(0, t) for t in (0.0, 0.1, 0.2, 1.1, 1.99, 2.0)]
    assert 0 < lrs[0] < lrs[1] < lrs[2] == tr.s.lr           # warm-up over the first 10 % of the seconds
    assert lrs[2] > lrs[3] > lrs[4] > lrs[5] == 0.0          # then the cosine reaches zero at the end
    tr.train(tmp_path / "ck", progress=False)
    assert 0 < tr.rows_seen < 10**9 and tr.seconds_before > 1.0       # it stopped by itself, on time
