"""The GPU training route, dry-run on the CPU so it cannot rot: prompts pre-tokenized for the GPU machine,
tools/gpu/train_job.py (torch target harvest + training + export, as tools/gpu/train.sh runs it on the H100),
and the way back: its token data rebuilt into a CPU dataset (features by prefill) that training continues on."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.slow
def test_gpu_train_job_dry_run_on_cpu_and_its_data_comes_back(tmp_path):
    from dflash_gguf.native.wrappers import Model
    from dflash_gguf.packaged_models import smollm2_q4_1
    from dflash_gguf.train.dataset import FeatureDataset
    from dflash_gguf.train.refeature import import_tokens
    target = smollm2_q4_1()
    npz = tmp_path / "prompts.npz"
    subprocess.run([sys.executable, str(ROOT / "tools/gpu/prepare_train.py"), "--limit", "6", "--out", str(npz)],
                   check=True)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "tools/gpu/train_job.py"), str(out), "--target", str(target),
                    "--prompts-npz", str(npz), "--device", "cpu", "--limit", "6", "--parallel", "3",
                    "--max-new", "16", "--harvest-seconds", "600", "--train-seconds", "20", "--rows", "3000",
                    "--state", str(tmp_path / "state")], check=True)
    record = json.loads((out / "train-job.json").read_text())
    from dflash_gguf.train.precision import autocast_dtype_name
    expected = autocast_dtype_name("cpu") or "float32"          # bf16 where the CPU has AVX512_BF16 / AMX
    assert record["sequences"] == 6 and record["labelled_rows"] > 0 and record["precision"] == expected
    drafter = Model(out / "smollm2-dflash-gpu.gguf")
    assert drafter.arch == "dflash" and drafter.target_layer_ids() == [2, 11, 19, 28]
    from dflash_gguf.target_file import TargetFile
    back = import_tokens(out / "gpu-harvest-tokens.npz", TargetFile.open(target), tmp_path / "cpu-data", n_threads=2)
    cpu, gpu = FeatureDataset(tmp_path / "cpu-data"), FeatureDataset(tmp_path / "state" / "data")
    assert len(back.done) == 6 and cpu.index == [r | {"offset": c["offset"]} for r, c in zip(gpu.index, cpu.index)]
    np.testing.assert_array_equal(np.asarray(cpu.tokens), np.asarray(gpu.tokens))
    a, b = np.asarray(cpu.feats[:-1], np.float32), np.asarray(gpu.feats[:-1], np.float32)
    rows = np.abs(b).sum(1) > 0
    assert np.linalg.norm(a[rows] - b[rows]) / np.linalg.norm(b[rows]) < 0.05     # llama.cpp vs torch taps
