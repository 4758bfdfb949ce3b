"""One way errors reach a person: `error: <file or option>: <what is wrong>; <what to do>`, exit 2 for bad
input, 1 for a runtime failure, a traceback only with --debug; the server reports the same errors."""

from __future__ import annotations

import random
import struct
import time

import pytest

from dflash_gguf.assets import ASSETS
from dflash_gguf.cli import main
from dflash_gguf.packaged_models import smollm2_q4_1

DRAFTER = ASSETS / "smollm2-135m-instruct.dflash-q8_0.gguf"


def _fails(capsys, argv: list[str]) -> tuple[int, str]:
    """Run the CLI in-process; return (exit code, the single stderr line)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return e.value.code, lines[0]


def _damaged(tmp_path):
    """The files a new user tried (issue 15): each must be refused before llama.cpp sees it."""
    data = DRAFTER.read_bytes()
    flipped = bytearray(data)
    rng = random.Random(15)
    for p in rng.sample(range(8, 64), 20):        # counts, first key length and key: the header proper
        flipped[p] ^= 0xFF
    files = {"truncated-1mb.gguf": data[: 1 << 20], "random-4kb.gguf": rng.randbytes(4096),
             "text.gguf": b"this is a text file\n", "empty.gguf": b"", "flipped.gguf": bytes(flipped)}
    out = {}
    for name, raw in files.items():
        out[name] = tmp_path / name
        out[name].write_bytes(raw)
    return out


@pytest.mark.parametrize("name, why", [("truncated-1mb.gguf", "truncated"), ("random-4kb.gguf", "not a GGUF file"),
                                       ("text.gguf", "not a GGUF file"), ("empty.gguf", "empty"),
                                       ("flipped.gguf", "damaged")])
def test_a_damaged_drafter_is_one_line_and_exit_2(tmp_path, capsys, name, why):
    bad = _damaged(tmp_path)[name]
    code, line = _fails(capsys, ["run", "-md", str(bad), "-p", "hi", "-n", "2"])
    assert code == 2 and line.startswith(f"error: {bad}: ") and why in line
    assert "download or convert it again" in line or "pass a .gguf model file" in line     # what to do


def test_a_truncated_target_says_truncated(tmp_path, capsys):
    bad = tmp_path / "target-5mb.gguf"
    with open(smollm2_q4_1(), "rb") as f:
        bad.write_bytes(f.read(5_000_000))
    code, line = _fails(capsys, ["run", "-m", str(bad), "-p", "hi", "-n", "2"])
    assert code == 2 and f"{bad}: tensor" in line and "ends at byte 5000000" in line and "truncated" in line


def test_a_missing_target_and_a_target_passed_as_drafter(capsys):
    code, line = _fails(capsys, ["run", "-m", "nope.gguf", "-p", "hi"])
    assert code == 2 and line.startswith("error: nope.gguf: no such file")
    target = smollm2_q4_1()
    code, line = _fails(capsys, ["run", "-md", str(target), "-p", "hi"])
    assert code == 2 and "is a 'llama' model, not a DFlash drafter" in line and "convert" not in line


@pytest.mark.parametrize("argv, flag", [
    (["run", "--temp", "-1"], "--temp"),
    (["run", "--top-p", "0"], "--top-p"),
    (["run", "--top-p", "1.5"], "--top-p"),
    (["run", "--top-k", "-1"], "--top-k"),
    (["run", "--min-p", "2"], "--min-p"),
    (["run", "-n", "0"], "-n"),
    (["run", "-c", "16"], "-c"),
    (["run", "--t-mode", "greedy"], "--t-mode"),
    (["run", "--draft-source", "ngram"], "--draft-source"),
    (["run", "--draft-max", "0"], "--draft-max"),
    (["run", "--draft-min", "0"], "--draft-min"),
    (["run", "-ts", "a,b"], "--tensor-split"),
    (["run", "--backend", "opencl"], "--backend"),
    (["run", "--device", "none,Vulkan0"], "--device"),
    (["run", "--fit-target", "-1"], "--fit-target"),
    (["run", "--device", "Vulkan7", "-n", "2"], "--device Vulkan7"),
    (["bench", "--prompts", "p.jsonl", "--backend", "opencl"], "--backend"),
    (["serve", "--backend", "opencl"], "--backend"),
    (["run", "-p", "x", "-f", "x.txt"], "-p or -f"),
    (["serve", "--t-mode", "greedy"], "--t-mode"),
    (["serve", "-c", "16"], "-c"),
    (["serve", "--port", "0"], "--port"),
    (["serve", "--max-tokens", "0"], "--max-tokens"),
    (["bench", "--prompts", "p.jsonl", "-n", "1"], "-n"),
    (["bench", "--prompts", "p.jsonl", "--repeat", "0"], "--repeat"),
    (["bench", "--prompts", "p.jsonl", "--limit", "0"], "--limit"),
    (["bench", "--prompts", "p.jsonl", "--baselines", "fast"], "--baselines"),
])
def test_out_of_range_options_are_refused_in_one_line(tmp_path, capsys, monkeypatch, argv, flag):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    code, line = _fails(capsys, argv)
    assert code == 2 and flag in line


def test_a_context_below_the_prompt_is_refused(tmp_path, capsys):
    prompt = tmp_path / "long.txt"
    prompt.write_text("word " * 300)
    code, line = _fails(capsys, ["run", "--plain", "-f", str(prompt), "-c", "128", "-n", "4"])
    assert code == 2 and "the prompt alone is 301 tokens" in line and "pass -c 305 or more" in line


def _no_tensors(tmp_path):
    """A target whose header says 0 tensors: well-formed, so it passes validation, but llama.cpp refuses it."""
    src = smollm2_q4_1()
    bad = tmp_path / "no-tensors.gguf"
    with open(src, "rb") as f:
        head = bytearray(f.read(4 << 20))
    head[8:16] = struct.pack("<Q", 0)
    bad.write_bytes(head)
    return bad


def test_a_runtime_failure_is_one_line_and_exit_1(tmp_path, capsys):
    bad = _no_tensors(tmp_path)
    code, line = _fails(capsys, ["run", "--plain", "-m", str(bad), "-p", "hi", "-n", "2"])
    assert code == 1 and str(bad) in line and "llama.cpp could not load" in line


def test_debug_adds_the_traceback(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--debug", "run", "-m", "nope.gguf"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: nope.gguf")


def test_health_names_the_file_when_the_model_fails_to_load_after_start(tmp_path):
    httpx = pytest.importorskip("httpx")
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.server.commands import _load_engine
    from dflash_gguf.settings import EngineSettings
    from helpers.server import LiveServer

    bad = _no_tensors(tmp_path)
    settings = EngineSettings(target=bad, n_ctx=256, n_threads=1)
    srv = LiveServer(lambda: _load_engine(Engine, settings, bad, plain=True))
    try:
        deadline = time.time() + 60
        while srv.worker.status == "loading" and time.time() < deadline:
            time.sleep(0.05)
        r = httpx.get(srv.base + "/health")
        assert r.status_code == 503 and str(bad) in r.json()["error"]["message"]
        r = httpx.post(srv.base + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and str(bad) in r.json()["error"]["message"]
    finally:
        srv.close()


def test_a_drafter_for_another_target_is_refused_before_loading(tmp_path, capsys):
    from helpers.engine import write_tiny_llama
    other = write_tiny_llama(tmp_path / "other.gguf", n_vocab=64, n_embd=96, n_layer=2, n_head=4)
    code, line = _fails(capsys, ["run", "-m", str(other), "-md", str(DRAFTER), "-p", "hi"])
    assert code == 2 and f"{DRAFTER}: does not fit target other.gguf: hidden size 576 != target hidden size 96" in line
    assert "out of range for a target with 2 layers" in line and "dflash-gguf train" in line


def test_an_engine_built_directly_refuses_a_misfit_before_loading(tmp_path):
    """Servers and libraries build the Engine without the CLI: it runs the same header check (no second one)."""
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.gguf_check import BadModelFile
    from dflash_gguf.settings import EngineSettings
    from helpers.engine import write_tiny_llama
    other = write_tiny_llama(tmp_path / "other.gguf", n_vocab=64, n_embd=96, n_layer=2, n_head=4)
    with pytest.raises(BadModelFile) as refused:
        Engine(EngineSettings(target=other, drafter=DRAFTER, n_ctx=256))
    said = str(refused.value)
    assert said.startswith(f"{DRAFTER}: does not fit target other.gguf: hidden size 576 != target hidden size 96")
    assert "out of range for a target with 2 layers" in said and "dflash-gguf train -m" in said


@pytest.mark.parametrize("flag, value", [("--short-blocks", "1.5"), ("--distill", "-0.1"), ("--tv", "1.2")])
def test_out_of_range_training_shares_are_refused_in_one_line(tmp_path, capsys, flag, value):
    code, line = _fails(capsys, ["train", "-m", str(smollm2_q4_1()), "-o", str(tmp_path / "d.gguf"), flag, value])
    assert code == 2 and line.startswith(f"error: {flag} {value}: ") and "between 0 and 1" in line
    assert not (tmp_path / "d.gguf").exists()


@pytest.mark.parametrize("args, says", [(["--tv", "0.6", "--distill", "0.5"], "error: --tv 0.6: "),
                                        (["--supervised-slots", "8"], "error: --supervised-slots 8: choose 1..7")])
def test_loss_options_that_cannot_combine_are_refused_in_one_line(tmp_path, capsys, args, says):
    code, line = _fails(capsys, ["train", "-m", str(smollm2_q4_1()), "-o", str(tmp_path / "d.gguf"), *args])
    assert code == 2 and line.startswith(says)
    assert not (tmp_path / "d.gguf").exists()


def test_a_negative_markov_rank_is_refused_in_one_line(tmp_path, capsys):
    from helpers.engine import write_tiny_llama
    target = write_tiny_llama(tmp_path / "t.gguf")
    code, line = _fails(capsys, ["train", "-m", str(target), "-o", str(tmp_path / "d.gguf"), "--markov-rank", "-1"])
    assert code == 2 and line.startswith("error: --markov-rank -1: choose 0 (no Markov head) or a rank of at least 1")
    assert not (tmp_path / "d.gguf").exists()


@pytest.mark.parametrize("value", ["yes", "1", "flash"])
def test_an_unknown_flash_attention_mode_is_one_line(capsys, monkeypatch, value):
    monkeypatch.setenv("DFLASH_GGUF_FLASH_ATTN", value)
    code, line = _fails(capsys, ["run", "-p", "hi", "-n", "2"])
    assert code == 2 and f"DFLASH_GGUF_FLASH_ATTN {value}: must be one of auto, on, off" in line
