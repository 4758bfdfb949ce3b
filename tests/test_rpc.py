"""Multi-host through llama.cpp's own RPC backend: two ggml rpc-servers on loopback, same output."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from dflash_gguf.native.build import tool_path
from helpers.engine import write_tiny_llama


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"rpc-server on port {port} did not start")


def _run(model, *extra) -> dict:
    cmd = [sys.executable, "-m", "dflash_gguf.cli", "run", "-m", str(model), "--plain", "--json", "-p", "t4 t7 t9",
           "-n", "24", "-c", "256", "-t", "2", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, DFLASH_GGUF_LOG="info"))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout), out.stderr


@pytest.mark.slow
def test_two_rpc_servers_on_loopback_give_the_same_tokens(tmp_path):
    server = tool_path("ggml-rpc-server")
    model = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, text=True)
    ports = [_free_port(), _free_port()]
    procs = [subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(p), "-t", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    try:
        for p in ports:
            _wait_port(p)
        local, _ = _run(model)
        remote, log = _run(model, "-ngl", "99", "--rpc", ",".join(f"127.0.0.1:{p}" for p in ports), "-ts", "1,1")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
    assert remote["tokens"] == local["tokens"]
    # the layers really went to both servers
    assert log.count("RPC") >= 2 and all(f"127.0.0.1:{p}" in log for p in ports), log[-3000:]
