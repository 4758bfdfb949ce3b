"""`dflash-gguf serve` as a user runs it: a model named from LM Studio's tree, the drafter found beside
it, a chat template file, an API key; loopback by default and said so; SIGTERM stops it. Errors a
user can fix are raised before anything starts."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from dflash_gguf.cli import app
from dflash_gguf.errors import UserError
from dflash_gguf.paths import cache_root
from dflash_gguf.server.commands import _announce
from helpers.engine import write_random_drafter, write_tiny_llama
from helpers.server import free_port

pytest.importorskip("uvicorn")


def test_serve_from_lmstudio_name(tmp_path):
    home = tmp_path / "home"
    folder = home / ".lmstudio" / "models" / "acme" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    target = write_tiny_llama(folder / "tiny.gguf", text=True, n_layer=3)
    write_random_drafter(target, folder / "tiny-dflash.gguf", taps=[1, 3], n_head=4, n_head_kv=2, head_dim=16,
                         n_ff=64)
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m.content }} {% endfor %}")
    port = free_port()
    env = {**os.environ, "HOME": str(home), "DFLASH_GGUF_CACHE": str(cache_root())}   # native libs stay found
    for var in ("HF_HOME", "HF_HUB_CACHE", "JAN_DATA_FOLDER", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        env.pop(var, None)
    cmd = [sys.executable, "-c", "from dflash_gguf.cli import main; main()", "serve", "-m", "lmstudio:acme/Tiny-GGUF",
           "--port", str(port), "--api-key", "k", "--chat-template", str(template), "-c", "256", "-t", "1",
           "--no-adaptive", "--draft-max", "3", "--max-tokens", "5"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "the server never became ready"
            time.sleep(0.2)
        auth = {"Authorization": "Bearer k"}
        assert httpx.get(base + "/v1/models", headers=auth).json()["data"][0]["id"] == "tiny"
        r = httpx.post(base + "/v1/chat/completions", headers=auth, timeout=60,
                       json={"messages": [{"role": "user", "content": "t5 t9 t3"}], "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5                  # --max-tokens is the default
        assert r.json()["timings"]["draft_n"] > 0                           # the drafter found beside it runs
        assert httpx.post(base + "/v1/completions", json={"prompt": "t5"}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert proc.returncode in (0, -signal.SIGTERM), err[-2000:]
    assert "loopback only" in err and "tiny-dflash.gguf (fits tiny.gguf" in err


def test_serve_refuses_unknown_names_before_starting(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(cache_root()))
    monkeypatch.setenv("HOME", str(tmp_path))
    out = CliRunner().invoke(app, ["serve", "-m", "lmstudio:nobody/nothing"])
    assert isinstance(out.exception, UserError) and "no such model" in str(out.exception)
    lonely = write_tiny_llama(tmp_path / "lonely.gguf")
    out = CliRunner().invoke(app, ["serve", "-m", str(lonely)])
    assert isinstance(out.exception, UserError) and "no drafter found" in str(out.exception)
    assert "--plain" in str(out.exception)


def test_non_loopback_without_key_warns_loudly():
    lines = []
    _announce("0.0.0.0", 8080, None, lines.append)
    assert any("WARNING" in ln and "WITHOUT an API key" in ln for ln in lines)
    lines.clear()
    _announce("::1", 8080, None, lines.append)
    assert "loopback only" in lines[0] and not any("WARNING" in ln for ln in lines)
    lines.clear()
    _announce("192.168.1.5", 8080, "key", lines.append)
    assert not any("WARNING" in ln for ln in lines) and "API key" in lines[0]


def test_models_lists_nothing_helpfully(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("HF_HOME", "HF_HUB_CACHE", "JAN_DATA_FOLDER", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("dflash_gguf.assets.ASSETS", tmp_path / "no-assets")
    out = CliRunner().invoke(app, ["models"])
    assert out.exit_code == 0 and "no GGUF files found in" in out.output and ".lmstudio" in out.output


