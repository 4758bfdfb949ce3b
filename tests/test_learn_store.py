"""Recording for `train --adapt`: shards written atomically (a writer killed mid-write leaves none broken),
tagged, capped oldest-first; the server records finished requests only with --learn and says so in /props."""

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dflash_gguf.engine.sources.corpus import Corpus
from dflash_gguf.errors import UserError
from dflash_gguf.learn.store import LearnStore, Recorder, Tags, recorder_for

TAGS = Tags("t.gguf", "a" * 64, "d.gguf", "b" * 64, None)


def test_record_and_read_round_trip_oldest_first(tmp_path):
    store = LearnStore(tmp_path / "learn")
    store.record(TAGS, [1, 2, 3], [4, 5])
    store.record(TAGS, [6], [7, 8, 9])
    got = store.read()
    assert [(c.prompt, c.answer) for c in got] == [([1, 2, 3], [4, 5]), ([6], [7, 8, 9])]
    assert got[0].tags == TAGS


def test_the_cap_drops_the_oldest_shards_first(tmp_path):
    store = LearnStore(tmp_path, max_bytes=1500)
    for i in range(20):
        store.record(TAGS, [i] * 50, [i])
    kept = store.read()
    assert store.size() <= 1500 and 0 < len(kept) < 20
    assert [c.prompt[0] for c in kept] == list(range(20 - len(kept), 20))     # the newest, in order


WRITER = """
import builtins, os, signal, sys
from pathlib import Path
from dflash_gguf.learn import store as learn_store

class DiesMidWrite:
    # the third shard: half of its bytes reach the disk, then the process is killed
    def __init__(self, f):
        self.f = f
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        os.fsync(self.f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name):
        return getattr(self.f, name)

store = learn_store.LearnStore(Path(sys.argv[1]))
tags = learn_store.Tags("t.gguf", "a" * 64)
store.record(tags, [1] * 1000, [2] * 10)
store.record(tags, [3] * 1000, [4] * 10)
learn_store.open = lambda *a, **k: DiesMidWrite(builtins.open(*a, **k))
store.record(tags, [5] * 1000, [6] * 10)
"""


def test_a_writer_killed_mid_write_leaves_no_broken_shard(tmp_path):
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path)], cwd=root, timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert list(tmp_path.glob(".*.tmp")), "the killed write left nothing behind: the test did not kill mid-write"
    conversations = LearnStore(tmp_path).read()          # raises on a half-written shard
    assert [c.prompt[0] for c in conversations] == [1, 3]


def test_a_partial_temporary_file_is_skipped_and_a_damaged_shard_is_named(tmp_path):
    store = LearnStore(tmp_path)
    store.record(TAGS, [1], [2])
    (tmp_path / ".00000000000000000001-1.json.tmp").write_text('{"format": "dflash-gguf-le')
    assert len(store.read()) == 1
    bad = tmp_path / "99999999999999999999-1.json"
    bad.write_text('{"format": "dflash-gguf-learn/1", "prompt": [1]')
    with pytest.raises(UserError, match=str(bad)):
        store.read()


def test_learning_is_off_unless_asked_and_a_bad_cap_is_refused(tmp_path):
    assert recorder_for(None, 256, tmp_path / "t.gguf") is None
    with pytest.raises(UserError, match="--learn-max-mb"):
        recorder_for(tmp_path / "learn", 0, tmp_path / "t.gguf")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a folder"):
        recorder_for(tmp_path / "file", 1, tmp_path / "t.gguf")


def test_the_recorder_tags_target_drafter_and_template(tmp_path):
    target, drafter = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"target bytes")
    drafter.write_bytes(b"drafter bytes")
    rec = Recorder(LearnStore(tmp_path / "learn"), target)
    rec.record([1, 2], [3], template="{{ messages }}", drafter=drafter)
    rec.record([1, 2], [3], template=None, drafter=None)
    first, second = LearnStore(tmp_path / "learn").read()
    assert first.tags == Tags("t.gguf", hashlib.sha256(b"target bytes").hexdigest(), "d.gguf",
                              hashlib.sha256(b"drafter bytes").hexdigest(),
                              hashlib.sha256(b"{{ messages }}").hexdigest())
    assert second.tags.drafter is None and second.tags.template_sha256 is None
    assert str(tmp_path / "learn") in rec.announce()


def _serve(tmp_path, recorder):
    pytest.importorskip("uvicorn")
    from helpers.server import TOOLS_TEMPLATE, FakeEngine, LiveServer
    srv = LiveServer(lambda: FakeEngine(lambda prompt: "Hello there!", n_ctx=2048)).wait_ready()
    srv.worker.recorder = recorder
    return srv, TOOLS_TEMPLATE


def _chat(srv, text):
    r = httpx.post(srv.base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]},
                   timeout=30)
    assert r.status_code == 200, r.text
    srv.wait_idle()


def test_the_server_records_finished_requests_with_learn(tmp_path):
    target = tmp_path / "t.gguf"
    target.write_bytes(b"target bytes")
    srv, template = _serve(tmp_path, Recorder(LearnStore(tmp_path / "learn", 2**20), target))
    srv.worker.corpus = corpus = Corpus()
    try:
        _chat(srv, "Hi")
        r = httpx.post(srv.base + "/v1/completions", json={"prompt": "def f():", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200
        srv.wait_idle()
        props = httpx.get(srv.base + "/props", timeout=30).json()
    finally:
        srv.close()
    assert props["learning"] == {"enabled": True, "store": str(tmp_path / "learn"), "max_mb": 1.0,
                                 "lookup_answers": 2, "lookup_tokens": len("Hello there!") + len("Hell")}
    chat, completion = LearnStore(tmp_path / "learn").read()
    assert bytes(chat.prompt).decode().endswith("Hi<|im_end|>\n<|im_start|>assistant\n")   # as rendered
    assert bytes(chat.answer).decode() == "Hello there!"
    assert chat.tags.template_sha256 == hashlib.sha256(template.encode()).hexdigest()
    assert bytes(completion.prompt) == b"def f():" and bytes(completion.answer) == b"Hell"
    assert completion.tags.template_sha256 is None
    # each finished answer joined the lookup's corpus, which the next request drafts from
    assert corpus.answers == [chat.answer, completion.answer]


def test_without_learn_the_server_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "cache"))
    srv, _ = _serve(tmp_path, None)
    try:
        _chat(srv, "Hi")
        props = httpx.get(srv.base + "/props", timeout=30).json()
    finally:
        srv.close()
    assert props["learning"] == {"enabled": False}
    assert not [p for p in tmp_path.rglob("*")], "a request without --learn wrote a file"
