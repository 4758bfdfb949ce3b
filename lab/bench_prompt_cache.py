#!/usr/bin/env python3
"""Time to first token of a chat's 5th turn with the prompt cache and with `cache_prompt: false`.

Starts `dflash-gguf serve` (the embedded default unless -m; `-c 4096 -t 2` as a new user runs it), plays a chat
of a system prompt and four questions with greedy answers of up to --answer tokens each (~2k tokens in all with
the defaults), then times turn 5 streamed: the request sent with the cache once the server is idle (the user
read the answer), sent at once after turn 4's answer (an agent, or a user quicker than the re-decode of the
answer), and with `cache_prompt: false`, --repeats times each, turn 4 replayed before every cached run so the
server holds the same conversation each time. Checks that all give the same greedy text. Then a second
conversation displaces the first, and turn 5 of the first is timed again: restored from the RAM cache.

    .venv/bin/python lab/bench_prompt_cache.py [--prompts chat.jsonl] [-m TARGET.gguf]

--prompts: a JSONL file of {"prompt": ...} rows; questions 1-5 of the chat are its first five (default: five
fixed questions written here).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

QUESTIONS = [
    "Explain how a hash table works and when its lookups become slow.",
    "Write a Python function that merges two sorted lists, and explain its running time.",
    "What are the main differences between processes and threads on Linux?",
    "Describe three ways to make a web page load faster, with an example of each.",
    "Summarise everything we discussed so far in five bullet points.",
]
SYSTEM = ("You are a careful assistant for a software team. Answer precisely, show code when it helps, and keep "
          "the answers structured with short paragraphs. ") * 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("dflash-gguf")
    cmd = [str(exe), "serve", "-c", str(args.ctx), "-t", str(args.threads), "--port", str(port),
           "--slot-save-path", args.slot_dir]
    if args.model:
        cmd += ["-m", args.model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    import httpx
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become ready in 600 s")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def turn(base: str, messages: list[dict], max_tokens: int, cache: bool = True) -> tuple[float, str, dict]:
    """(seconds to the first content chunk, text, timings) of one streamed greedy chat request."""
    import httpx
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "cache_prompt": cache}
    t0 = time.perf_counter()
    ttft, text, timings = None, "", {}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                piece = c["delta"].get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            timings = chunk.get("timings", timings)
    ttft = ttft if ttft is not None else time.perf_counter() - t0
    log(f"turn of {len(messages)} messages (cache {cache}): ttft {ttft:.3f} s, {timings.get('cache_n')} cached + "
        f"{timings.get('prompt_n')} prefilled, {timings.get('predicted_n')} generated")
    return ttft, text, timings


def wait_idle(base: str) -> None:
    """Until the server has finished the last request's work (the user reads the answer before typing)."""
    import httpx
    while httpx.get(base + "/slots", timeout=60).json()[0]["is_processing"]:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--answer", type=int, default=400, help="max tokens of each answer of turns 1-4")
    ap.add_argument("--last", type=int, default=32, help="max tokens of the timed 5th answer")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=Path, default=None)
    a = ap.parse_args(argv)
    questions = QUESTIONS
    if a.prompts:
        rows = [json.loads(x) for x in a.prompts.read_text().splitlines() if x.strip()]
        questions = [r["prompt"] for r in rows[:5]]
    import tempfile
    port = free_port()
    tmp = tempfile.TemporaryDirectory()
    a.slot_dir = tmp.name
    proc = start_server(a, port)
    base = f"http://127.0.0.1:{port}"
    try:
        msgs = [{"role": "system", "content": SYSTEM}]
        for q in questions[:4]:
            msgs.append({"role": "user", "content": q})
            _, answer, _ = turn(base, msgs, a.answer)
            msgs.append({"role": "assistant", "content": answer})
        turn4, last = msgs[:-1], msgs + [{"role": "user", "content": questions[4]}]
        warm, at_once, cold, texts = [], [], [], set()
        for _ in range(a.repeats):
            turn(base, turn4, a.answer)                          # the server holds turns 1-4 again
            t, text, _ = turn(base, last, a.last)                # sent as soon as turn 4's answer is out
            at_once.append(t)
            texts.add(text)
            turn(base, turn4, a.answer)
            wait_idle(base)
            t, text, tw = turn(base, last, a.last)
            warm.append(t)
            texts.add(text)
            wait_idle(base)
            t, text, tc = turn(base, last, a.last, cache=False)
            cold.append(t)
            texts.add(text)
        n_prompt = tw["cache_n"] + tw["prompt_n"]
        other = [{"role": "system", "content": "You answer in one sentence."},
                 {"role": "user", "content": "Name a prime number larger than 100."}]
        turn(base, turn4, a.answer)
        turn(base, other, 16)                                    # displaces the chat: it is parked in RAM
        wait_idle(base)
        t_ram, text, tr = turn(base, last, a.last)
        texts.add(text)
        import httpx
        saved = httpx.post(base + "/slots/0?action=save", json={"filename": "bench.bin"}, timeout=120).json()
        restored = httpx.post(base + "/slots/0?action=restore", json={"filename": "bench.bin"}, timeout=120).json()
        isa = sorted({w for w in open("/proc/cpuinfo").read().split() if w.startswith("avx512")}) \
            if os.path.exists("/proc/cpuinfo") else []
        report = {
            "turn5_prompt_tokens": n_prompt, "cache_n": tw["cache_n"],
            "ttft_cached_s": [round(x, 3) for x in warm], "ttft_at_once_s": [round(x, 3) for x in at_once],
            "ttft_cold_s": [round(x, 3) for x in cold],
            "median_cached_s": round(statistics.median(warm), 3), "median_at_once_s": round(statistics.median(at_once), 3),
            "median_cold_s": round(statistics.median(cold), 3),
            "ratio": round(statistics.median(warm) / statistics.median(cold), 3),
            "ratio_at_once": round(statistics.median(at_once) / statistics.median(cold), 3),
            "ttft_restored_from_ram_s": round(t_ram, 3), "restored_cache_n": tr["cache_n"],
            "slot_file": {"tokens": saved["n_saved"], "bytes": saved["n_written"],
                          "save_ms": saved["timings"]["save_ms"], "restore_ms": restored["timings"]["restore_ms"]},
            "identical_greedy_text": len(texts) == 1, "cpu_isa": isa or ["no avx512"],
            "server": f"serve -c {a.ctx} -t {a.threads}" + (f" -m {a.model}" if a.model else " (embedded default)"),
        }
        print(json.dumps(report, indent=2))
        return 0 if len(texts) == 1 else 1
    finally:
        proc.terminate()
        proc.wait(30)
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
