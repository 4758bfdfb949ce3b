"""`train --parallel auto`: each width is harvested for the probe's seconds into a scratch folder that is gone
afterwards, and the width with the most response tokens per second is the one the run harvests with."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dflash_gguf.errors import UserError
from dflash_gguf.train import parallel_probe
from dflash_gguf.train.harvest import HarvestSettings


class _Written:
    def __init__(self, tokens: int, seconds: float):
        self.n_response_written, self.seconds = tokens, seconds


def test_the_fastest_width_wins_and_scratch_is_removed(monkeypatch, tmp_path):
    asked, folders = [], []
    rate = {4: 100.0, 8: 340.0, 16: 250.0, 32: 90.0}

    def fake_harvest(target, prompts, out, settings, max_seconds):
        asked.append((settings.n_parallel, max_seconds, settings.taps))
        folders.append(out)
        return _Written(int(rate[settings.n_parallel] * 2), 2.0)

    monkeypatch.setattr(parallel_probe, "harvest", fake_harvest)
    best = parallel_probe.best_parallel("target", [{"prompt": "x"}], HarvestSettings(taps=[1, 2]), seconds=3.0)
    assert best == 8
    assert asked == [(w, 3.0, [1, 2]) for w in parallel_probe.WIDTHS]
    assert folders and not any(f.exists() for f in folders)


@pytest.mark.slow
def test_probe_harvests_a_tiny_target(tmp_path):
    from dflash_gguf.target_file import TargetFile
    from helpers.engine import write_tiny_llama
    target = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=64, text=True, seed=3)
    rows = [{"category": "chat", "format": "completion", "prompt": f"t{i % 29 + 3} t{(i * 7) % 29 + 3}"}
            for i in range(16)]
    settings = HarvestSettings(taps=[1, 3], ctx_per_seq=128, max_new={"chat": 12}, n_threads=2)
    with TargetFile.open(target) as tf:
        assert parallel_probe.best_parallel(tf, rows, settings, widths=(1, 4), seconds=1.0) in (1, 4)
    assert not list(tmp_path.glob("dflash-gguf-parallel-*"))


@pytest.mark.parametrize("value", ["0", "x", "-3", "4.5"])
def test_parallel_refused_unless_a_positive_number_or_auto(tmp_path, value):
    from dflash_gguf.cli import app
    r = CliRunner().invoke(app, ["train", "-m", str(tmp_path / "t.gguf"), "-o", str(tmp_path / "d.gguf"),
                                 "--parallel", value])
    assert isinstance(r.exception, UserError) and f"--parallel {value}" in str(r.exception), r.output
