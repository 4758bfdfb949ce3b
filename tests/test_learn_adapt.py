"""`run --learn` records, `train --adapt` continues a drafter on the records: on a tiny random target, a store
from another target is refused in one line, the input drafter is never overwritten, the drafter written is the
checkpoint with the best held-back τ among those that hold the general-set τ (--general-drop), none is written when
no such checkpoint beats the start (unless --force), and greedy decoding with the adapted drafter equals plain
decoding."""

import hashlib
import json
import math

import numpy as np
import pytest

from dflash_gguf.learn.store import LearnStore, Tags

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from helpers.engine import write_random_drafter, write_tiny_llama
    folder = tmp_path_factory.mktemp("adapt")
    target = write_tiny_llama(folder / "t.gguf", text=True, n_layer=3, seed=4)
    drafter = write_random_drafter(target, folder / "d.gguf", taps=[1, 3], n_layers=1, block_size=4, n_head=4,
                                   n_head_kv=2, head_dim=16, n_ff=128)
    prompts = folder / "prompts.jsonl"        # the drafter's "training prompts": completions (no chat template)
    prompts.write_text("".join(json.dumps({"category": "chat", "format": "completion",
                                           "prompt": f"t{i % 29 + 3} t{(i * 7) % 29 + 3}"}) + "\n" for i in range(24)))
    return folder, target, drafter, prompts


@pytest.fixture(scope="module")
def recorded(tiny, tmp_path_factory):
    """One user's traffic, recorded as `run --learn` records it (6 requests: 5 trained on, 1 held back), and a
    folder for the replayed data that the adapting runs share."""
    folder, target, drafter, _ = tiny
    root = tmp_path_factory.mktemp("recorded")
    for i in range(6):
        p = " ".join(f"t{(i * 5 + k) % 29 + 3}" for k in range(4))
        assert cli("run", "-m", target, "-md", drafter, "-p", p, "-n", "24", "-t", "1", "--json", "--no-compare",
                   "--learn", root / "learn") == 0
    return root / "learn", root / "replay"


def adapt_cli(tiny, recorded, out, work, *extra):
    folder, target, drafter, prompts = tiny
    learn, replay = recorded
    # paced by rows, not minutes: the checkpoints (where scripted τ is handed out) do not depend on the machine's speed
    return cli("train", "--adapt", learn, "-m", target, "-md", drafter, "-o", out, "--prompts", prompts,
               "--rows", "300", "--max-minutes", "30", "-t", "1", "--work-dir", work, "--data-dir", replay, *extra)


def scripted_tau(monkeypatch, start: float, checkpoints: list[float], general: tuple[float, list[float]] = (1.5, [1.5]),
                 everyday: tuple[float, list[float]] = (1.5, [1.5]),
                 blends: dict[float, tuple[float, float]] | None = None, spread: float = 0.0,
                 code: tuple[float, list[float]] | None = None) -> dict:
    """τ made up instead of measured: on the held-back requests `start` for the drafter adapting starts from (the
    first file measured), then checkpoints[i] for the i-th new checkpoint (the last value repeated); on the general
    set likewise general[0], then general[1][i], and on the everyday set everyday[0], everyday[1][i]; a blend of
    share x (its dflash_gguf.train.blend) gets blends[x] = (held back, general), the everyday set holding. Each set's
    four prompts read its τ exactly for the start, and for every later drafter its τ ± `spread` alternately (the
    per-prompt changes then have a standard error of spread / sqrt(3), their mean the pooled change). The general
    set's one category is chat at its pooled τ, or with `code` also code at code[0], then code[1][i] (blends: code[0]).
    Returns {file sha256: held-back τ}."""
    from dflash_gguf.train.adapt import Yardstick
    given: dict[str, float] = {}
    generals: dict[str, float] = {}
    everydays: dict[str, float] = {}
    codes: dict[str, float] = {}
    n_checkpoints = [-1]
    first: dict[str, str] = {}

    def tau(self, drafter):
        key = sha(drafter)
        share = blend_share(drafter)
        if key not in given and share is not None:
            given[key], generals[key] = blends[share]
            everydays[key] = everyday[0]
            codes[key] = code[0] if code else 0.0
        elif key not in given:
            i = n_checkpoints[0]
            n_checkpoints[0] += 1
            given[key] = start if i < 0 else checkpoints[min(i, len(checkpoints) - 1)]
            generals[key] = general[0] if i < 0 else general[1][min(i, len(general[1]) - 1)]
            everydays[key] = everyday[0] if i < 0 else everyday[1][min(i, len(everyday[1]) - 1)]
            codes[key] = 0.0 if not code else code[0] if i < 0 else code[1][min(i, len(code[1]) - 1)]
        first.setdefault("key", key)
        d = 0.0 if key == first["key"] else spread

        def each(v: float) -> list[float]:
            return [v + d, v - d, v + d, v - d]
        categories = {"chat": generals[key]} | ({"code": codes[key]} if code else {})
        return {"held_back": given[key], "general": generals[key], "general_by_category": categories,
                "everyday": everydays[key], "everyday_by_category": {"chat": everydays[key]},
                "general_per_prompt": each(generals[key]), "everyday_per_prompt": each(everydays[key])}
    monkeypatch.setattr(Yardstick, "tau", tau)
    return given


def cli(*args):
    from dflash_gguf.cli import main
    try:
        main([str(a) for a in args])
    except SystemExit as e:
        return e.code
    return 0


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def blend_share(path) -> float | None:
    """dflash_gguf.train.blend of a drafter `train --adapt` wrote: the last checkpoint's share, if it is a blend."""
    from dflash_gguf.gguf_reader import open_gguf
    field = open_gguf(path).fields.get("dflash_gguf.train.blend")
    return None if field is None else round(float(field.contents()), 6)


def test_run_learn_records_the_prompt_and_answer_it_printed(tiny, tmp_path, capsys):
    folder, target, drafter, _ = tiny
    code = cli("run", "-m", target, "-md", drafter, "-p", "t5 t9 t11", "-n", "12", "-t", "1", "--json",
               "--no-compare", "--learn", tmp_path / "learn")
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    (conv,) = LearnStore(tmp_path / "learn").read()
    assert conv.answer == out["tokens"] and len(conv.answer) == 12
    assert out["stats"]["n_prompt"] == len(conv.prompt)
    assert conv.tags.target_sha256 == sha(target) and conv.tags.drafter_sha256 == sha(drafter)
    assert conv.tags.template_sha256 is None                       # a raw prompt, no chat template
    assert cli("run", "-m", target, "-md", drafter, "-p", "t5", "-n", "4", "-t", "1", "--json", "--no-compare") == 0
    assert len(LearnStore(tmp_path / "learn").read()) == 1          # without --learn nothing is recorded


def test_a_store_from_another_target_is_refused_in_one_line(tiny, tmp_path, capsys):
    folder, target, drafter, _ = tiny
    LearnStore(tmp_path / "learn").record(Tags("other.gguf", "0" * 64), [1, 2, 3], [4, 5, 6])
    LearnStore(tmp_path / "learn").record(Tags("other.gguf", "0" * 64), [1, 2], [4, 5])
    code = cli("train", "--adapt", tmp_path / "learn", "-m", target, "-md", drafter, "-o", tmp_path / "new.gguf")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "recorded with other.gguf" in err and "not -m t.gguf" in err
    assert not (tmp_path / "new.gguf").exists()


def test_the_drafter_being_adapted_is_never_the_output(tiny, tmp_path, capsys):
    folder, target, drafter, _ = tiny
    before = sha(drafter)
    code = cli("train", "--adapt", tmp_path, "-m", target, "-md", drafter, "-o", drafter, "--force")
    assert code == 2 and "that is the drafter being adapted" in capsys.readouterr().err
    assert sha(drafter) == before


def test_adapt_refuses_distill_which_it_does_not_apply(tiny, tmp_path, capsys):
    folder, target, drafter, _ = tiny           # only --tv is wired to the top-k the adapting data keep
    code = cli("train", "--adapt", tmp_path, "-m", target, "-md", drafter, "-o", tmp_path / "new.gguf",
               "--distill", "0.5")
    err = capsys.readouterr().err
    assert code == 2 and "--distill" in err and "hard labels" in err
    assert not (tmp_path / "new.gguf").exists()


@pytest.mark.slow
def test_adapt_with_tv_keeps_the_targets_top_k_of_every_labelled_token(tiny, recorded, tmp_path, monkeypatch, capsys):
    """--tv: the replayed and the recorded sequences keep the target's top-8 at row p - 1 for each token p the
    target wrote (its distribution there, as a decode of the whole sequence gives it), -1 elsewhere."""
    from dflash_gguf.native.lib import load
    from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model
    from dflash_gguf.train.adapt import RECORDED_INDEX
    from dflash_gguf.train.dataset import FeatureDataset, spans_of
    from dflash_gguf.train.harvest import top_k_probs
    folder, target, drafter, _ = tiny
    scripted_tau(monkeypatch, 2.0, [2.1])
    code = adapt_cli(tiny, recorded, tmp_path / "adapted.gguf", tmp_path / "work", "--tv", "0.5")
    assert code == 0, capsys.readouterr().err
    data = FeatureDataset(tmp_path / "work" / "data")
    assert data.top_k == 8
    model = Model(target)
    ctx = Context(model, ContextSettings(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1))
    batch = Batch(load(), 512)
    kinds = set()
    try:
        for r in data.index:
            off, n = r["offset"], r["length"]
            ids = np.asarray(data.topk_ids[off:off + n])
            labelled = np.zeros(n, bool)
            for a, b in spans_of(r):
                labelled[a - 1:b - 1] = True
            assert labelled.any() and (ids[~labelled] == -1).all() and (ids[labelled] >= 0).all()
            kinds.add(r["prompt_index"] >= RECORDED_INDEX)
            if r["prompt_index"] < RECORDED_INDEX:
                continue
            ctx.clear()
            batch.set_tokens(np.asarray(data.tokens[off:off + n]).tolist(), 0, "all")
            ctx.decode(batch)
            want_ids, want_p = top_k_probs(np.array(ctx.logits_all(n)[labelled], np.float32), 8)
            assert np.array_equal(ids[labelled], want_ids)
            got_p = np.asarray(data.topk_p[off:off + n], np.float32)[labelled]
            assert np.allclose(got_p, want_p, atol=2e-3)
    finally:
        batch.close()
        ctx.close()
    assert kinds == {True, False}                              # replayed and recorded sequences both


@pytest.mark.slow
def test_adapt_writes_the_checkpoint_with_the_best_held_back_tau(tiny, recorded, tmp_path, monkeypatch, capsys):
    given = scripted_tau(monkeypatch, 2.0, [2.1, 2.6, 2.2])     # the second checkpoint is the best
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    taus = [c["tau_held_back"] for c in record["checkpoints"]]
    assert len(taus) >= 3 and taus[:3] == [2.1, 2.6, 2.2]
    assert record["kept"] == record["checkpoints"][1] and record["written"]
    assert given[sha(out)] == 2.6                           # not the last checkpoint's file
    assert record["tau_after"]["held_back"] == 2.6 and record["tau_before"]["held_back"] == 2.0
    assert "the best of" in captured.out
    assert [c["tau_general"] for c in record["checkpoints"]][:3] == [1.5, 1.5, 1.5]     # measured at each


@pytest.mark.slow
def test_adapt_keeps_only_checkpoints_that_hold_the_general_set(tiny, recorded, tmp_path, monkeypatch, capsys):
    # held back: the second checkpoint is the best (what was written before --general-drop), but it lost 0.34 on
    # the general set; the first held it but is worse than the third, which fell 0.04 (within 0.05)
    given = scripted_tau(monkeypatch, 2.0, [2.1, 2.6, 2.2, 2.05], (2.24, [2.23, 1.90, 2.20, 2.24]))
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--general-drop", "0.05")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    points = [(c["tau_held_back"], c["tau_general"]) for c in record["checkpoints"]]
    assert len(points) >= 3 and points[:3] == [(2.1, 2.23), (2.6, 1.90), (2.2, 2.20)]
    assert record["kept"] == record["checkpoints"][2] and record["written"] and record["general_drop"] == 0.05
    assert given[sha(out)] == 2.2 and record["tau_after"]["general"] == 2.20

    # a tolerance of 0.03 rules the third out too: the first (2.1 held back, 2.23 general) is written
    scripted_tau(monkeypatch, 2.0, [2.1, 2.6, 2.2, 2.05], (2.24, [2.23, 1.90, 2.20, 2.24]))
    code = adapt_cli(tiny, recorded, out, tmp_path / "work2", "--general-drop", "0.03", "--force")
    assert code == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "work2" / "adapt-record.json").read_text())
    assert record["kept"]["tau_held_back"] == 2.1 and record["kept"]["tau_general"] == 2.23


@pytest.mark.slow
def test_a_fall_within_the_tolerance_counts_its_standard_error(tiny, recorded, tmp_path, monkeypatch, capsys):
    # the third checkpoint fell 0.04 on the general set, within 0.05, but its four prompts moved by -0.04 ± 0.03
    # (standard error 0.03 / sqrt(3) = 0.017): the fall's upper bound 0.057 is past 0.05, so the first is written
    given = scripted_tau(monkeypatch, 2.0, [2.1, 2.6, 2.2, 2.05], (2.24, [2.23, 1.90, 2.20, 2.24]), spread=0.03)
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--general-drop", "0.05")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    third = record["checkpoints"][2]
    assert (third["tau_general"], third["tau_general_se"]) == (2.20, round(0.03 / 3 ** 0.5, 4))
    assert record["kept"] == record["checkpoints"][0] and given[sha(out)] == 2.1
    assert "general 2.200 ± 0.017 (start 2.240)" in captured.err

    # measured without the spread (every prompt moved alike), the same fall holds: the third is written
    scripted_tau(monkeypatch, 2.0, [2.1, 2.6, 2.2, 2.05], (2.24, [2.23, 1.90, 2.20, 2.24]))
    code = adapt_cli(tiny, recorded, tmp_path / "b.gguf", tmp_path / "work2", "--general-drop", "0.05")
    assert code == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "work2" / "adapt-record.json").read_text())
    assert record["kept"]["tau_held_back"] == 2.2 and record["kept"]["tau_general_se"] == 0.0


@pytest.mark.slow
def test_a_checkpoint_that_lost_one_category_of_the_general_set_is_not_kept(tiny, recorded, tmp_path, monkeypatch,
                                                                           capsys):
    # the pooled general set holds at every checkpoint (the user's category rose as much as code fell), but code
    # fell 0.10 at the second, the best on the held-back requests: the third, which held every category, is written
    given = scripted_tau(monkeypatch, 2.0, [2.1, 2.6, 2.3, 2.05], (2.24, [2.24]), code=(2.0, [1.98, 1.90, 2.0]))
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--general-drop", "0.05")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    assert [c["tau_general_by_category"]["code"] for c in record["checkpoints"]][:3] == [1.98, 1.90, 2.0]
    assert record["kept"] == record["checkpoints"][2] and given[sha(out)] == 2.3
    assert "general's code 1.900 (start 2.000) lost" in captured.err

    # when every checkpoint that beats -md lost it, nothing is written and the line says which category
    scripted_tau(monkeypatch, 2.0, [1.9, 2.6, 2.3, 1.95], (2.24, [2.24]), code=(2.0, [2.0, 1.90, 1.93, 2.0]))
    code = adapt_cli(tiny, recorded, tmp_path / "b.gguf", tmp_path / "work2", "--general-drop", "0.05")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not (tmp_path / "b.gguf").exists()
    assert "on the general set's code (2.00 → at most 1.93); --general-drop)" in err[-1]


def test_the_paired_error_is_the_standard_error_of_the_per_prompt_changes():
    from dflash_gguf.train.adapt import paired_error
    changes = np.array([0.1, -0.1, 0.1, -0.1])
    assert paired_error([2.0] * 4, list(2.0 + changes)) == round(changes.std(ddof=1) / 2, 4)
    assert paired_error([1.0, 2.0], [1.5, 2.5]) == 0.0              # every prompt moved alike
    assert paired_error([2.0], [1.0]) is None and paired_error([1.0, 2.0], [1.0]) is None


@pytest.mark.slow
def test_adapt_writes_nothing_when_the_better_checkpoints_lose_the_general_set(tiny, recorded, tmp_path, monkeypatch,
                                                                               capsys):
    scripted_tau(monkeypatch, 2.0, [1.9, 2.6, 2.3, 1.95], (2.24, [2.24, 1.90, 2.10, 2.24]))
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--general-drop", "0.05")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not out.exists()
    assert "not written: the 2 checkpoint(s) that beat d.gguf on the 1 held-back recorded requests (τ 2.00, best " \
           "2.60) lost more than 0.05 τ, one standard error included, on the general set (2.24 → at most 2.10) or " \
           "the general set's chat (2.24 → at most 2.10); --general-drop)" in err[-1]
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    assert not record["written"] and record["kept"]["tau_held_back"] in (1.9, 1.95)  # held the general set


@pytest.mark.slow
def test_adapt_blends_the_last_checkpoint_with_the_start_when_it_lost_the_general_set(tiny, recorded, tmp_path,
                                                                                     monkeypatch, capsys):
    # every checkpoint after the first lost the general set (2.24 → 2.10, 2.05); of the blends of the last one with
    # the start, 0.9 and 0.85 still lose it and 0.8 holds it with more held-back τ than the first checkpoint: the
    # bisection of the seven shares measures 0.75 (holds), 0.85 (lost), 0.8 (holds), and 0.8 is written
    blends = {0.9: (2.68, 2.12), 0.85: (2.66, 2.17), 0.8: (2.62, 2.20), 0.75: (2.6, 2.22), 0.7: (2.55, 2.23)}
    given = scripted_tau(monkeypatch, 2.0, [2.3, 2.6, 2.7], (2.24, [2.22, 2.10, 2.05]), blends=blends)
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    measured = [(c.get("blend"), c["tau_held_back"]) for c in record["checkpoints"]]
    assert measured[-3:] == [(0.75, 2.6), (0.85, 2.66), (0.8, 2.62)]
    assert [b for b, _ in measured[:-3]] == [None] * (len(measured) - 3)
    assert record["kept"]["blend"] == 0.8 and record["written"] and record["tau_after"]["general"] == 2.20
    assert blend_share(out) == 0.8 and given[sha(out)] == 2.62
    assert record["kept"]["step"] == record["checkpoints"][-4]["step"]         # a blend of the last checkpoint
    assert "a blend of 0.8 of the one" in captured.out

    # resumed, nothing is measured again and the same file is written
    out.unlink()
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--resume", tmp_path / "work")
    assert code == 0, capsys.readouterr().err
    again = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    assert again["checkpoints"] == record["checkpoints"] and blend_share(out) == 0.8 and given[sha(out)] == 2.62

    # without blends, no checkpoint that beats the start holds the general set but the first
    scripted_tau(monkeypatch, 2.0, [2.3, 2.6, 2.7], (2.24, [2.22, 2.10, 2.05]), blends=blends)
    code = adapt_cli(tiny, recorded, tmp_path / "plain.gguf", tmp_path / "work2", "--blends", "none")
    assert code == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "work2" / "adapt-record.json").read_text())
    assert record["kept"]["tau_held_back"] == 2.3 and all(c.get("blend") is None for c in record["checkpoints"])


@pytest.mark.slow
def test_adapt_keeps_back_from_its_time_box_what_its_measurements_will_take(tiny, recorded, tmp_path, monkeypatch):
    # --max-minutes bounds the whole run: training gets the box less what the checkpoints' and blends' measurements
    # will take, each as long as one measurement of the start's weights exported as a checkpoint (timed before
    # training; here made to take 50 s): 6 checkpoints + 3 blends, 450 s; and what each checkpoint's pause costs
    # besides (the trainer's save and validation, timed too; here made to take 5 s): 30 s; both times
    # RESERVE_MARGIN (1.5), 720 s
    import dflash_gguf.train.adapt as adapt_module
    scripted_tau(monkeypatch, 2.0, [2.1, 2.2])
    timed = {"measurement": [], "pause": []}
    measurement_seconds, pause_seconds = adapt_module._measurement_seconds, adapt_module._pause_seconds

    def slow_measurement(*args):
        timed["measurement"].append(measurement_seconds(*args))
        return 50.0

    def slow_pause(*args):
        timed["pause"].append(pause_seconds(*args))
        return 5.0
    monkeypatch.setattr(adapt_module, "_measurement_seconds", slow_measurement)
    monkeypatch.setattr(adapt_module, "_pause_seconds", slow_pause)
    assert adapt_module.measurements_planned(adapt_module.AdaptSettings()) == 6 + 3
    assert adapt_cli(tiny, recorded, tmp_path / "adapted.gguf", tmp_path / "work") == 0      # --max-minutes 30
    plan = json.loads((tmp_path / "work" / "adapt-plan.json").read_text())
    assert len(timed["measurement"]) == 1 and 0 < timed["measurement"][0] < 50
    assert len(timed["pause"]) == 1 and 0 < timed["pause"][0] < 5
    assert not (tmp_path / "work" / "pause-timing").exists()
    assert adapt_module.RESERVE_MARGIN == 1.5
    assert 30 * 60 - 720 - 300 < plan["train_seconds"] <= 30 * 60 - 720


def test_a_blend_mixes_every_tensor_the_start_has_in_the_same_shape():
    from dflash_gguf.train.adapt import blended
    start = {"a": np.zeros(4, np.float32), "b": np.ones(2, np.float32)}
    adapted = {"a": np.full(4, 2.0, np.float32), "b": np.full(3, 5.0, np.float32), "c": np.full(1, 7.0, np.float32)}
    mixed = blended(start, adapted, 0.75)
    assert mixed["a"].tolist() == [1.5] * 4 and mixed["a"].dtype == np.float32
    assert mixed["b"].tolist() == [5.0] * 3 and mixed["c"].tolist() == [7.0]     # new or reshaped: the adapted one


def test_adapt_refuses_blend_shares_outside_zero_and_one(tiny, recorded, tmp_path, capsys):
    code = adapt_cli(tiny, recorded, tmp_path / "o.gguf", tmp_path / "work", "--blends", "0.9,1.5")
    assert code != 0 and "--blends" in capsys.readouterr().err and not (tmp_path / "o.gguf").exists()


@pytest.mark.slow
def test_adapt_keeps_only_checkpoints_that_hold_the_everyday_set_too(tiny, recorded, tmp_path, monkeypatch, capsys):
    # the general set holds everywhere; the everyday set (what chat apps are asked) fell 0.09 at the second and third
    # checkpoints, the best two on the held-back requests: the first, which held both, is written
    given = scripted_tau(monkeypatch, 2.0, [2.1, 2.6, 2.3, 2.05], (2.24, [2.24]), (2.10, [2.08, 2.01, 2.01, 2.10]))
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--general-drop", "0.05")
    assert code == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    points = [(c["tau_held_back"], c["tau_everyday"]) for c in record["checkpoints"]]
    assert points[:3] == [(2.1, 2.08), (2.6, 2.01), (2.3, 2.01)]
    assert record["kept"] == record["checkpoints"][0] and record["written"] and given[sha(out)] == 2.1
    assert record["tau_before"]["everyday"] == 2.10 and record["tau_after"]["everyday"] == 2.08

    # when every checkpoint that beats -md loses it, nothing is written and the line says which set was lost
    scripted_tau(monkeypatch, 2.0, [1.9, 2.6, 2.3, 1.95], (2.24, [2.24]), (2.10, [2.10, 2.01, 2.02, 2.10]))
    out2 = tmp_path / "adapted2.gguf"
    code = adapt_cli(tiny, recorded, out2, tmp_path / "work2", "--general-drop", "0.05")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not out2.exists()
    assert "lost more than 0.05 τ, one standard error included, on the everyday set (2.10 → at most 2.02); " \
           "--general-drop)" in err[-1]


@pytest.mark.slow
def test_the_yardstick_measures_the_everyday_set_through_the_targets_chat_template():
    from dflash_gguf.assets import shipped_drafter_for
    from dflash_gguf.corpus.prompts import everyday_set
    from dflash_gguf.packaged_models import smollm2_q4_1
    from dflash_gguf.train.adapt import AdaptSettings, Yardstick
    target = smollm2_q4_1()
    yardstick = Yardstick(target, [], [], everyday_set(1), AdaptSettings(eval_tokens=24, threads=2))
    tau = yardstick.tau(shipped_drafter_for(target))
    assert tau["everyday"] >= 1.0 and set(tau["everyday_by_category"]) == {"chat", "math"}
    assert math.isnan(tau["general"]) and math.isnan(tau["held_back"])
    assert [c.row["id"] for c in yardstick.conts] == [r["id"] for r in everyday_set(1)]


def test_the_default_replay_holds_the_everyday_mix_the_shipped_drafter_was_continued_on_but_not_the_guards():
    from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS, HELD_BACK_FROM, everyday_rows, family, load
    from dflash_gguf.train.adapt import prompt_sets
    pool, general, everyday = prompt_sets((), 10, 0)
    from_mix = [r for r in pool if str(r.get("id", "")).startswith("everyday-mix:")]
    assert len(everyday) == 20 and len(general) == 30
    assert len(from_mix) == len(everyday_rows()) - 20 and not {r["id"] for r in from_mix} & {r["id"] for r in everyday}
    guarded = {family(r) for r in general}
    assert len(guarded) == 30                                   # ten families per category, one prompt each
    trained_part = [r for r in load(DEFAULT_PROMPTS)[:HELD_BACK_FROM] if family(r) not in guarded]
    assert HELD_BACK_FROM - 1500 < len(trained_part) < HELD_BACK_FROM  # the guard's families are a small part
    assert len(pool) - len(from_mix) == len(trained_part)       # the default set's part before the held-back one
    assert not guarded & {family(r) for r in pool}              # the replay protects none of the guard's families
    assert pool == prompt_sets((), 10, 0)[0] and pool != prompt_sets((), 10, 1)[0]     # a fixed order per seed


def test_a_prompts_family_is_its_template_module_or_section_and_a_question_of_its_own():
    from dflash_gguf.corpus.prompts import family, general_set
    assert family({"source": "template:24:7"}) == "template:24"
    assert family({"source": "cpython:email.utils:parseaddr"}) == "cpython:email.utils"
    assert family({"source": "debian-packages:database:rocksdb-tools"}) == "debian-packages:database"
    assert family({"source": "self-instruct:problem:debian-packages:games:x"}) == "self-instruct:problem:debian-" \
                                                                                  "packages:games:x"
    assert family({"prompt": "a"}) != family({"prompt": "b"})
    rows = [{"category": "math", "source": f"template:{i % 3}:{i}"} for i in range(9)]
    picked = general_set(rows, 5)                               # three families: three prompts, the last of each
    assert [r["id"] for r in picked] == [8, 7, 6]


def test_the_replay_leaves_out_the_general_sets_families_from_other_prompt_files(tmp_path):
    from dflash_gguf.corpus.prompts import family
    from dflash_gguf.train.adapt import prompt_sets
    rows = [{"category": "code", "source": f"lib:mod{i % 4}:f{i}", "prompt": f"p{i}"} for i in range(12)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool, general, _ = prompt_sets((path,), 2, 0)
    assert {family(r) for r in general} == {"lib:mod3", "lib:mod2"}
    assert sorted(r["prompt"] for r in pool) == sorted(f"p{i}" for i in range(12) if i % 4 < 2)
    from dflash_gguf.errors import UserError
    with pytest.raises(UserError, match="no prompts left to replay"):
        prompt_sets((path,), 4, 0)


def test_the_everyday_set_is_single_turn_everyday_requests_and_story_problems():
    from dflash_gguf.corpus.prompts import EVERYDAY_PROMPTS, everyday_set, load
    rows = everyday_set(10)
    assert [r["category"] for r in rows] == ["chat"] * 10 + ["math"] * 10
    assert len({r["id"] for r in rows}) == 20 and all(r["id"].startswith("everyday-mix:") for r in rows)
    source = load(EVERYDAY_PROMPTS)
    for r in rows:
        i = int(r["id"].split(":")[1])
        assert source[i]["prompt"] == r["prompt"] and not source[i].get("followups")
        assert source[i]["source"].startswith("everyday:" if r["category"] == "chat" else "template:story")
    assert everyday_set(3) == rows[:3] + rows[10:13]     # the last ones of each kind, the same whatever the count


@pytest.mark.slow
def test_adapt_rows_ends_training_and_spreads_the_checkpoints_over_them(tiny, recorded, tmp_path, monkeypatch,
                                                                         capsys):
    scripted_tau(monkeypatch, 2.0, [2.1, 2.2, 2.3, 2.4, 2.5, 2.6])
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--rows", "300", "--max-minutes", "10")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    rows = [c["labelled_rows"] for c in record["checkpoints"]]
    assert 300 <= record["labelled_rows"] < 300 + 12 * 3 + 1 and rows[-1] == record["labelled_rows"]
    assert len(rows) >= 3 and rows == sorted(rows) and rows[0] < 300     # measured on the way, not only at the end
    assert record["checkpoints"][-1]["train_minutes"] < 5 and record["adapt_settings"]["rows"] == 300


@pytest.mark.slow
def test_adapt_writes_nothing_when_no_checkpoint_beats_the_start(tiny, recorded, tmp_path, monkeypatch, capsys):
    scripted_tau(monkeypatch, 2.5, [2.4, 2.3, 2.45, 2.2])   # training only makes it worse on held-back requests
    folder, target, drafter, prompts = tiny
    before = sha(drafter)
    out = tmp_path / "adapted.gguf"
    code = adapt_cli(tiny, recorded, out, tmp_path / "work")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not out.exists() and sha(drafter) == before
    assert "not written: no checkpoint beat d.gguf on the 1 held-back recorded requests (τ 2.50, best checkpoint " \
           "2.45)" in err[-1]
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    assert not record["written"] and record["kept"]["tau_held_back"] == 2.45
    assert [c["tau_held_back"] for c in record["checkpoints"]][:3] == [2.4, 2.3, 2.45]

    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--force")    # asked for: the best one anyway
    assert code == 0 and out.is_file() and sha(drafter) == before
    assert "writing the best one anyway (--force)" in capsys.readouterr().err


@pytest.mark.slow
def test_adapt_writes_a_new_drafter_that_decodes_losslessly(tiny, recorded, tmp_path, capsys):
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.engine.sampling import SamplingParams
    from dflash_gguf.settings import EngineSettings
    folder, target, drafter, prompts = tiny
    capsys.readouterr()
    before = sha(drafter)
    out = tmp_path / "adapted.gguf"
    # --force: whether a few seconds of training beat a random drafter is not this test's question
    code = adapt_cli(tiny, recorded, out, tmp_path / "work", "--force")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sha(drafter) == before and out.is_file()
    record = json.loads((tmp_path / "work" / "adapt-record.json").read_text())
    assert record["recorded_train"] == 5 and record["recorded_held_back"] == 1 and record["replayed"] == 5
    assert record["tau_after"]["held_back"] >= 1.0 and record["tau_before"]["general"] >= 1.0
    # the tiny target has no chat template: the everyday set (chat requests) is left out, said in one line
    assert math.isnan(record["tau_before"]["everyday"]) and all(c["tau_everyday"] is None for c in record["checkpoints"])
    assert "t.gguf has no chat template: the everyday set is not measured" in captured.err
    assert record["labelled_rows"] > 0 and record["checkpoints"] and record["written"]
    assert record["kept"]["tau_held_back"] == max(c["tau_held_back"] for c in record["checkpoints"])
    assert "held-back recorded requests" in captured.out

    engine = Engine(EngineSettings(target=target, drafter=out, n_ctx=256, n_threads=1, adaptive=False, draft_max=3))
    try:
        assert engine.drafter_model.path == out
        prompt = engine.target_model.tokenize("t5 t9 t11 t4", add_special=True)
        plain = engine.generate(prompt, 40, SamplingParams(), speculative=False)
        spec = engine.generate(prompt, 40, SamplingParams())
        assert spec.n_drafted > 0 and spec.tokens == plain.tokens
    finally:
        engine.close()
