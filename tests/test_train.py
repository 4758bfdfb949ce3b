"""Training: a few steps on a tiny random target lower the loss and export a drafter that decodes
losslessly; the shipped training prompts never contain an evaluation prompt."""

import json
from pathlib import Path

import numpy as np
import pytest

from dflash_gguf.corpus.prompts import FIRST_PROMPTS as PROMPTS
from dflash_gguf.corpus.prompts import load

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT.parent / "shared" / "prompts"     # the evaluation prompts, beside the checkout (as in CI)


def test_no_evaluation_prompt_in_training_prompts():
    train = {r["prompt"].strip() for r in load(PROMPTS)}
    assert len(train) > 1000
    cats = {r["category"] for r in load(PROMPTS)}
    assert cats == {"code", "math", "chat"}
    assert EVAL.is_dir(), f"the evaluation prompts must be beside the checkout to check against: {EVAL}"
    files = sorted(EVAL.glob("*.jsonl"))
    assert files, f"no *.jsonl in {EVAL}"
    for f in files:
        for line in f.read_text().splitlines():
            p = json.loads(line)["prompt"].strip()
            assert p not in train
            # no shared function signature either (HumanEval prompts start with a def line)
            first = next((x for x in p.splitlines() if x.startswith("def ")), None)
            if first:
                assert not any(first in t for t in train), first


@pytest.mark.slow
def test_few_steps_lower_loss_and_export_decodes_losslessly(tmp_path):
    torch = pytest.importorskip("torch")  # noqa: F841
    from dflash_gguf.engine.sources.dflash import DFlashSource
    from dflash_gguf.engine.loop import SpecDecoder
    from dflash_gguf.engine.policy import DraftLengthPolicy
    from dflash_gguf.engine.target import Target
    from dflash_gguf.native.wrappers import ContextSettings, Model
    from dflash_gguf.target_file import TargetFile
    from dflash_gguf.train.harvest import HarvestSettings
    from dflash_gguf.train.pipeline import train_drafter
    from dflash_gguf.train.trainer import TrainSettings
    from helpers.engine import write_tiny_llama

    target = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=64, text=True, seed=3)
    # completions: the tiny vocabulary has no chat template
    prompts = [{"category": "chat", "format": "completion", "prompt": f"t{i % 29 + 3} t{(i * 7) % 29 + 3} t{(i * 3) % 29 + 3}"}
               for i in range(40)]
    settings = TrainSettings(n_layers=1, block_size=4, anchors_per_seq=16, seqs_per_step=2, epochs=3.0,
                             eval_every=10, lr=3e-3, warmup=0.1)
    out = tmp_path / "draft.gguf"
    with TargetFile.open(target) as tf:
        record = train_drafter(tf, out, prompts, tmp_path / "work", taps=[1, 3],
                               harvest_settings=HarvestSettings(taps=[1, 3], n_parallel=4, ctx_per_seq=128,
                                                                max_new={"chat": 48}, n_threads=2),
                               train_settings=settings, max_tokens=None, outtype="f32", progress=False,
                               draft_vocab=40)
    from dflash_gguf.convert.inspect_drafter import inspect_drafter
    assert inspect_drafter(out)["draft_vocab"] == 40 and 0.5 < record["draft_vocab"]["coverage_of_training_tokens"] <= 1
    history = json.loads((tmp_path / "work" / "checkpoint" / "history.json").read_text())
    first = np.mean([h["loss"] for h in history[:5]])
    last = np.mean([h["loss"] for h in history[-5:]])
    assert last < first * 0.8, (first, last)

    tm, dm = Model(target), Model(out)
    assert dm.meta("dflash_gguf.train.steps") == str(record["steps"]) and dm.target_layer_ids() == [1, 3]
    cs = ContextSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
    tgt = Target(tm, cs, taps=[1, 3], max_verify=4)
    spec = SpecDecoder(tgt, DFlashSource(dm, tgt.ctx, cs, tm), DraftLengthPolicy(3, adaptive=False))
    spec.debug_check_positions = True
    plain = SpecDecoder(tgt, None, DraftLengthPolicy(1, adaptive=False))
    prompt = tm.tokenize("t5 t9 t11", add_special=True)
    ref = plain.generate(prompt, 40, stop_tokens=lambda t: False)
    res = spec.generate(prompt, 40, stop_tokens=lambda t: False)
    assert res.tokens == ref.tokens
    assert record["val_tau_estimate"] >= 1.0

    # Continued on data that writes other tokens, the drafter keeps the vocabulary its layers propose; a new
    # drafter (or another size) counts its vocabulary on the data.
    from dflash_gguf.train.dataset import FeatureDataset
    from dflash_gguf.train.pipeline import build_trainer
    own = np.sort(np.asarray(dm.draft_vocab(), np.int64))
    data = FeatureDataset(tmp_path / "work" / "data")
    data.written_tokens = lambda ids: np.repeat(np.arange(tm.n_vocab - 40, tm.n_vocab), 5)
    with TargetFile.open(target) as tf:
        _, counted = build_trainer(tf, data, settings, draft_vocab=40)
        _, kept = build_trainer(tf, data, settings, draft_vocab=40, init_drafter=out)
        _, resized = build_trainer(tf, data, settings, draft_vocab=39, init_drafter=out)
    assert not np.array_equal(counted.token_ids, own) and np.array_equal(kept.token_ids, own)
    assert resized.size == 39 and set(resized.token_ids.tolist()) <= set(counted.token_ids.tolist())


def test_taps_auto_is_the_official_formula_shifted_to_tap_ids_and_bad_specs_are_user_errors():
    from dflash_gguf.errors import UserError
    from dflash_gguf.train.pipeline import parse_taps
    assert parse_taps("auto", 30) == [2, 11, 19, 28]          # z-lab target_layer_ids [1, 10, 18, 27] + 1
    assert parse_taps("1,3", 4) == [1, 3]
    for bad in ("x,2", "5", ""):
        with pytest.raises(UserError, match="--taps"):
            parse_taps(bad, 4)


def test_train_command_names_a_resume_folder_without_data(tmp_path):
    from typer.testing import CliRunner

    from dflash_gguf.cli import app
    from helpers.engine import write_tiny_llama
    target = write_tiny_llama(tmp_path / "t.gguf")      # a valid target: the --resume folder is what is wrong
    res = CliRunner().invoke(app, ["train", "-m", str(target), "-o", str(tmp_path / "d.gguf"),
                                   "--resume", str(tmp_path / "nothing")])
    assert res.exit_code != 0
    assert "--resume" in (res.output + str(res.exception))


def test_train_command_rejects_a_file_that_is_not_a_gguf(tmp_path):
    from typer.testing import CliRunner

    from dflash_gguf.cli import app
    target = tmp_path / "t.gguf"
    target.write_bytes(b"not a model")
    res = CliRunner().invoke(app, ["train", "-m", str(target), "-o", str(tmp_path / "d.gguf")])
    assert res.exit_code != 0
    assert "t.gguf: not a GGUF file" in (res.output + str(res.exception))
