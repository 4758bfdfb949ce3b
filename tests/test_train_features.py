"""Features that fit, losses that stay finite: hidden states beyond float16 (Gemma's reach ~1e5) are stored as
bfloat16 without overflow, a harvest refuses non-finite values, the dataset records each tap's range, and
training stops with one line at the first non-finite loss."""

import json

import numpy as np
import pytest

from dflash_gguf.errors import RunFailure
from dflash_gguf.train import features as fx
from dflash_gguf.train.dataset import FeatureDataset
from dflash_gguf.train.harvest import DatasetWriter

H, TAPS = 16, [1, 2]


def _writer(folder, dtype):
    return DatasetWriter(folder, {"target": "t.gguf", "taps": TAPS, "n_embd": H, "store_features": True,
                                  "top_k_probs": 0, "feature_dtype": dtype})


def test_bfloat16_keeps_gemma_sized_values_that_float16_turns_into_inf():
    x = np.array([[1.01e5, -9.0e4, 3.14159, -1e-3, 0.0, 65504.0, 7e5, 2.5e-6]], np.float32)
    with np.errstate(over="ignore"):
        assert not np.isfinite(x.astype(np.float16)).all()             # the bug of the issue
    back = fx.decode(fx.encode(x, "bfloat16"), "bfloat16")
    assert np.isfinite(back).all() and back.dtype == np.float32
    np.testing.assert_allclose(back, x, rtol=2 ** -8)                   # 8 bits of mantissa, rounded to nearest
    assert fx.encode(x, "bfloat16").nbytes == 2 * x.size
    assert fx.choose_dtype(100.0) == "float16" and fx.choose_dtype(1.01e5) == "bfloat16"
    assert fx.choose_dtype(65504 / 4) == "bfloat16"                    # float16 only with 8x headroom


@pytest.mark.parametrize("bad", [np.inf, np.nan, 7e4])
def test_a_harvest_refuses_values_its_dtype_cannot_hold(tmp_path, bad):
    w = _writer(tmp_path, "float16" if bad == 7e4 else "bfloat16")
    feats = np.ones((5, len(TAPS) * H), np.float32)
    feats[2, 3] = bad
    with pytest.raises(RunFailure, match="nothing of it was stored"):
        w.add(list(range(5)), [[1, 5]], {}, prompt_index=0, sampled=False, feats=feats)
    assert not (tmp_path / "tokens.bin").exists() and not (tmp_path / "index.jsonl").exists()


def test_the_dataset_reads_bfloat16_back_and_records_each_taps_range(tmp_path):
    w = _writer(tmp_path, "bfloat16")
    rng = np.random.default_rng(0)
    seqs = [rng.standard_normal((12, len(TAPS) * H)).astype(np.float32) for _ in range(2)]
    seqs[1][4, H + 2] = 1.01e5                                        # a Gemma-sized outlier in the second tap
    for i, f in enumerate(seqs):
        w.add(list(range(12)), [[2, 12]], {}, prompt_index=i, sampled=False, feats=f)
    data = FeatureDataset(tmp_path)
    np.testing.assert_allclose(data.features(12, 24), seqs[1], rtol=2 ** -8)
    ranges = json.loads((tmp_path / "ranges.json").read_text())["taps"]
    both = np.concatenate(seqs)
    assert ranges[0] == [both[:, :H].min(), both[:, :H].max()] and ranges[1][1] == pytest.approx(1.01e5, rel=2 ** -8)
    with pytest.raises(ValueError, match="feature_dtype"):             # a resumed harvest keeps the folder's dtype
        _writer(tmp_path, "float16")


def test_training_stops_with_one_line_at_the_first_non_finite_loss(tmp_path):
    torch = pytest.importorskip("torch")
    from dflash_gguf.drafter.config import DrafterConfig
    from dflash_gguf.train.trainer import Trainer, TrainSettings
    w = _writer(tmp_path / "d", "bfloat16")
    rng = np.random.default_rng(1)
    for i in range(6):
        w.add(rng.integers(2, 20, 30).tolist(), [[5, 30]], {}, prompt_index=i, sampled=False,
              feats=rng.standard_normal((30, len(TAPS) * H)).astype(np.float32))
    cfg = DrafterConfig(hidden_size=H, intermediate_size=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                        target_layers=TAPS, block_size=4, mask_token_id=1, vocab_size=24)
    tr = Trainer(FeatureDataset(tmp_path / "d"), cfg, rng.standard_normal((24, H)).astype(np.float32),
                 rng.standard_normal((24, H)).astype(np.float32), TrainSettings(n_layers=1, block_size=4, rows=5000))
    tr.train(tmp_path / "ck", progress=False, stop_at=200)
    before = tr.step
    with torch.no_grad():
        tr.model.fc.weight[0, 0] = float("nan")                        # what overflowed features did to the loss
    with pytest.raises(RunFailure) as e:
        tr.train(tmp_path / "ck", progress=False)
    assert "loss is nan" in str(e.value) and "\n" not in str(e.value) and tr.step == before
    assert (tmp_path / "ck" / "ckpt.pt").exists()
