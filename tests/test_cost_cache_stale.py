"""A cached verify-cost curve timed in another state of the machine is measured again: its scale follows the t(1)
the loop measures, its shape does not, and one timed while another process held a core (every price ~1000x, the
shape flat) made the policy price verifies as free in every later session (2026-12-06)."""

import json

import pytest

from dflash_gguf.engine import session as session_module
from dflash_gguf.engine.cost import STALE_CALIBRATION, calibration_is_stale
from dflash_gguf.engine.session import Engine
from dflash_gguf.settings import EngineSettings
from helpers.engine import project_prompts


def test_a_calibration_is_stale_only_past_the_factor_either_way():
    assert not calibration_is_stale(0.010, 0.010)
    assert not calibration_is_stale(0.010, 0.025)                        # a shared CPU's drift within minutes
    assert not calibration_is_stale(0.010, 0.0041)
    assert calibration_is_stale(0.010, 0.010 * STALE_CALIBRATION)
    assert calibration_is_stale(0.010, 0.010 / STALE_CALIBRATION)
    assert calibration_is_stale(3.15, 0.005)                              # the curve of 2026-12-06


@pytest.mark.slow
def test_a_curve_timed_1000x_slower_is_dropped_from_the_cache_after_a_generation(monkeypatch, tmp_path, capfd):
    monkeypatch.setattr(session_module, "cache_root", lambda: tmp_path)
    settings = EngineSettings(n_ctx=512, n_threads=2)
    Engine(settings).close()                                              # measured and cached
    path = tmp_path / "cost-curves.json"
    (key, curve), = json.loads(path.read_text()).items()
    for table in ("t", "t_cold", "t_draft_n"):
        curve[table] = {b: v * 1000 for b, v in curve[table].items()}
    curve["t_draft"] *= 1000
    path.write_text(json.dumps({key: curve}))
    engine = Engine(settings)
    try:
        assert engine.cost.t1() == pytest.approx(curve["t"]["1"])       # the cached curve is what it starts from
        prompt = engine.tokenize(project_prompts(per_category=1)[0], add_special=False)
        for _ in range(8):                                               # t(1) moves <= 2.3 % a step
            engine.generate(prompt, 96)
            if key not in json.loads(path.read_text()):
                break
    finally:
        engine.close()
    assert key not in json.loads(path.read_text())
    assert "measured again at the next start" in capfd.readouterr().err
    Engine(settings).close()                                              # the next start measures it anew
    assert json.loads(path.read_text())[key]["t"]["1"] < curve["t"]["1"] / STALE_CALIBRATION
