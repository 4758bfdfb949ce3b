#!/usr/bin/env python3
"""One person's traffic through the real server, then `train --adapt`, then τ and speed before and after.

Per domain (prompts of the shipped set's held-back part that the shipped drafter never saw, filtered by source):
  play     `dflash-gguf serve --learn STORE` answers --conversations prompts over HTTP (chat or completions, greedy,
           --max-tokens each); the server is then killed with SIGKILL while one more request runs (the store
           must still be readable); resumes where the store stops
  adapt    `dflash-gguf train --adapt STORE -md <shipped drafter> -o <work>/adapted.gguf --max-minutes M`
           (resumable: --resume)
  measure  τ as `bench --tau` measures it (bench.tau.measure_taus: both drafters along the same greedy
           continuations) on --test other prompts of the domain and on ../shared/prompts (first --shared per
           category); `bench --baselines plain,hybrid` speedup on --speedup of the domain's test prompts
Everything runs on the embedded default (SmolLM2-135M-Instruct Q4_1 + the shipped drafter). Results go to
<work>/<domain>/result.json and a markdown table on stdout. ../shared/prompts is measured, never trained on.

  nice -n 19 lab/learn_harness.py --domain debian --domain scipy --conversations 300 --test 50 --adapt-minutes 30
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.assets import shipped_drafter_for  # noqa: E402
from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS, HELD_BACK_FROM, general_set, load  # noqa: E402
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402

SHARED = ROOT.parent / "shared" / "prompts"
# one person's kind of traffic: sources of the shipped set's held-back part (prefix of `source`)
DOMAINS = {
    "debian": ("debian-packages:",),                       # asks about Debian packages (chat)
    "scipy": ("scipy:", "statsmodels:", "scikit-learn:", "numpy:", "pandas:", "matplotlib:"),  # completes code
}
ADAPT_GENERAL_MOST = 5                # train --adapt's general set: at most its default per category


def domain_rows(name: str) -> list[dict]:
    """The domain's held-back prompts in a fixed order, without train --adapt's general set."""
    rows = load(DEFAULT_PROMPTS)
    general = {r["id"] for r in general_set(rows[HELD_BACK_FROM:], ADAPT_GENERAL_MOST)}
    held = [(i, r) for i, r in enumerate(rows[HELD_BACK_FROM:]) if i not in general]
    return [{"id": f"prompts-v2:{HELD_BACK_FROM + i}", **r} for i, r in held if r["source"].startswith(DOMAINS[name])]


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "dflash_gguf.cli", *map(str, args)]


def run(cmd: list[str], log: Path) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    with open(log, "a") as f:
        done = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}; see {log}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def play(rows: list[dict], store: Path, a, log: Path) -> dict:
    """Serve with --learn and send the prompts the store does not hold yet; SIGKILL the server at the end."""
    import httpx
    have = len([p for p in store.glob("*.json")]) if store.is_dir() else 0
    todo = rows[have:a.conversations]
    if not todo:
        return {"recorded": have, "seconds": 0.0}
    port = free_port()
    cmd = cli("serve", "--port", port, "--learn", store, "-t", a.threads, "--max-tokens", a.max_tokens)
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    with open(log, "a") as f:
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    try:
        deadline = time.time() + 300
        while True:
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit(f"the server did not come up; see {log}")
            time.sleep(1)
        props = httpx.get(base + "/props", timeout=30).json()
        assert props["learning"]["enabled"], props["learning"]
        for i, r in enumerate(todo):
            request(base, r, a.max_tokens)
            if (have + i + 1) % 25 == 0:
                print(f"  {have + i + 1} conversations played ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        # one more request, and the server killed while it runs: the store must stay readable
        with httpx.Client(timeout=600) as client:
            try:
                client.post(base + "/v1/completions", json={"prompt": "def f(", "max_tokens": a.max_tokens},
                            timeout=0.5)
            except httpx.HTTPError:
                pass
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    return {"recorded": len(list(store.glob("*.json"))), "seconds": round(time.time() - t0, 1)}


def request(base: str, row: dict, max_tokens: int) -> None:
    import httpx
    if row.get("format") == "completion":
        body = {"prompt": row["prompt"], "max_tokens": max_tokens, "temperature": 0}
        path = "/v1/completions"
    else:
        body = {"messages": [{"role": "user", "content": row["prompt"]}], "max_tokens": max_tokens, "temperature": 0}
        path = "/v1/chat/completions"
    r = httpx.post(base + path, json=body, timeout=600)
    r.raise_for_status()


def taus(drafters: list[Path], rows: list[dict], out: Path, a) -> list[dict]:
    """τ of each drafter (`bench --tau`'s measurement) along the same greedy continuations, generated once."""
    if not out.exists():
        from dflash_gguf.bench.tau import measure_taus
        reports = measure_taus(drafters, smollm2_q4_1(), rows, a.max_tokens, a.threads)
        out.write_text(json.dumps([r.to_json() | {"per_prompt": r.per_prompt} for r in reports], indent=1))
    return [{"tau": r["tau"], "tau_overall": r["tau_overall"]} for r in json.loads(out.read_text())]


def speedup(drafter: Path, prompts: Path, out: Path, a, log: Path) -> dict | None:
    if not a.speedup:
        return None
    if not out.exists():
        run(cli("bench", "-md", drafter, "--prompts", prompts, "-n", a.max_tokens, "-t", a.threads,
                "--baselines", "plain,hybrid", "--json", out), log)
    hybrid = json.loads(out.read_text())["summary"]["all"]
    return {"speedup": hybrid["hybrid"]["speedup"]["median"], "tau": hybrid["hybrid"]["tau"]["median"],
            "tok_s": hybrid["hybrid"]["tok_s"]["median"], "plain_tok_s": hybrid["plain"]["tok_s"]["median"]}


def domain(name: str, a) -> dict:
    work = a.work / name
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    rows = domain_rows(name)
    need = a.conversations + a.test
    if len(rows) < need:
        raise SystemExit(f"domain {name}: {len(rows)} held-back prompts, fewer than --conversations + --test ({need})")
    speed_file = work / "speed.jsonl"
    speed_file.write_text("".join(json.dumps(r) + "\n" for r in rows[a.conversations:a.conversations + a.speedup]))
    store = work / "store"
    played = play(rows, store, a, log)
    shipped = shipped_drafter_for(smollm2_q4_1())
    adapted = work / "adapted.gguf"
    t0 = time.time()
    if not adapted.exists():
        run(cli("train", "--adapt", store, "-m", smollm2_q4_1(), "-md", shipped, "-o", adapted,
                "--max-minutes", a.adapt_minutes, "-t", a.threads, "--eval-prompts", a.adapt_eval,
                "--work-dir", work / "adapt",
                "--resume", work / "adapt"), log)
    adapt_record = json.loads((work / "adapt" / "adapt-record.json").read_text())
    shared = sorted(SHARED.glob("*.jsonl"))
    result = {"domain": name, "sources": DOMAINS[name], "played": played,
              "adapt": {k: adapt_record[k] for k in ("recorded_train", "recorded_held_back", "replayed",
                                                     "labelled_rows", "minutes", "tau_before", "tau_after")},
              "adapt_wall_minutes": round((time.time() - t0) / 60, 1)}
    from dflash_gguf.bench.prompts import read_rows
    domain_tau = taus([shipped, adapted], rows[a.conversations:need], work / "tau-domain.json", a)
    shared_tau = taus([shipped, adapted], read_rows(shared, a.shared), work / "tau-shared.json", a)
    for i, (label, drafter) in enumerate((("before", shipped), ("after", adapted))):
        result[label] = {"domain_tau": domain_tau[i], "shared_tau": shared_tau[i],
                         "speedup": speedup(drafter, speed_file, work / f"speed-{label}.json", a, log)}
    (work / "result.json").write_text(json.dumps(result, indent=2))
    return result


def table(results: list[dict], a) -> str:
    lines = [f"| domain | conversations recorded | adapt (min, rows) | τ unseen domain prompts ({a.test}) | "
             f"τ ../shared/prompts (first {a.shared}/category) | hybrid speedup ({a.speedup} prompts) |",
             "|---|---|---|---|---|---|"]
    for r in results:
        b, f = r["before"], r["after"]
        sp = "–"
        if b["speedup"] and f["speedup"]:
            sp = f"{_speed(b['speedup'])} → {_speed(f['speedup'])}"
        lines.append(f"| {r['domain']} | {r['played']['recorded']} | {r['adapt']['minutes']}, "
                     f"{r['adapt']['labelled_rows']:,} | {b['domain_tau']['tau_overall']:.3f} → "
                     f"{f['domain_tau']['tau_overall']:.3f} | {b['shared_tau']['tau_overall']:.3f} → "
                     f"{f['shared_tau']['tau_overall']:.3f} | {sp} |")
    return "\n".join(lines)


def _speed(s: dict) -> str:
    return f"{s['speedup']:.2f}× ({s['tok_s']:.0f} tok/s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", action="append", choices=sorted(DOMAINS), help="repeatable (default: all)")
    ap.add_argument("--conversations", type=int, default=300, help="recorded conversations per domain")
    ap.add_argument("--test", type=int, default=50, help="other prompts of the domain to measure on")
    ap.add_argument("--shared", type=int, default=10, help="../shared/prompts per category to measure on")
    ap.add_argument("--speedup", type=int, default=10, help="test prompts for the hybrid speedup (0: skip)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--adapt-minutes", type=float, default=30)
    ap.add_argument("--adapt-eval", type=int, default=ADAPT_GENERAL_MOST, choices=range(ADAPT_GENERAL_MOST + 1),
                    help="train --adapt --eval-prompts (its general set, per category)")
    ap.add_argument("--threads", type=int, default=1, help="one thread: ggml's threads wait for each other at "
                    "every op, which a busy machine makes dear")
    ap.add_argument("--work", type=Path, default=None, help="default: <user cache>/learn-harness")
    a = ap.parse_args()
    if a.work is None:
        from dflash_gguf.paths import cache_root
        a.work = cache_root() / "learn-harness"
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED}: the evaluation prompts must be beside the checkout")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    results = [domain(name, a) for name in a.domain or sorted(DOMAINS)]
    print(table(results, a))


if __name__ == "__main__":
    main()
