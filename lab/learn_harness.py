#!/usr/bin/env python3
"""One person's traffic through the real server, then `train --adapt`, then τ and speed before and after.

Per domain (prompts of the shipped set's held-back part that the shipped drafter never saw, filtered by source;
a persona domain sends them as a desktop app would: the same system prompt, with a fixed answer format, every time):
  play     `dflash-gguf serve --learn STORE` answers --conversations prompts over HTTP (chat or completions, greedy,
           --max-tokens each); the server is then killed with SIGKILL while one more request runs (the store
           must still be readable); resumes where the store stops
  adapt    `dflash-gguf train --adapt STORE -md <shipped drafter> -o <work>/adapted.gguf --max-minutes M`
           (resumable: --resume); it writes the checkpoint with the best held-back τ, or nothing if none beats
           the shipped drafter: the harness measures that best checkpoint (<work>/adapt/best.gguf) either way
           and says whether it was written
  measure  τ as `bench --tau` measures it (bench.tau.measure_taus: both drafters along the same greedy
           continuations) on --test other prompts of the domain (a persona's with its system prompt) and on
           ../shared/prompts (first --shared per category, no system prompt); `bench --baselines plain,hybrid`
           speedup on --speedup of the domain's test prompts (a persona's as whole chat requests, system
           prompt included);
           greedy output with the best checkpoint against plain decoding on --greedy test prompts
Everything runs on the embedded default (SmolLM2-135M-Instruct Q4_1 + the shipped drafter). Results go to
<work>/<domain>/result.json and a markdown table on stdout. ../shared/prompts is measured, never trained on.

  nice -n 19 lab/learn_harness.py --domain debian --domain scipy --conversations 300 --test 50 --adapt-minutes 30
  nice -n 19 lab/learn_harness.py --domain debian-helper --stop-after play     # record now, adapt later
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
    "word-problems": ("template:",),                       # school math word problems (chat)
    "man-pages": ("debian-man:",),                         # what a command does, from its man page (chat)
}
ADAPT_GENERAL_MOST = 10               # train --adapt's general set: at most its default per category


def _every_prompt(r: dict) -> bool:
    return True


def _as_written(r: dict) -> str:
    return r["prompt"]


@dataclass(frozen=True)
class Persona:
    """A desktop app's assistant: one system prompt with a fixed answer format, sent with every request."""
    domain: str                                         # whose held-back prompts the user asks
    system: str
    asks: Callable[[dict], bool] = _every_prompt        # the prompts this user would send
    user_turn: Callable[[dict], str] = _as_written      # the prompt as the user types it


# how the Debian prompts name a package's summary (its short description)
PACKAGE_SUMMARY = (
    r"What questions should I ask before installing \S+ \(a (?P<s>.+)\)\?",
    r"Write a haiku and then a one-sentence explanation about a (?P<s>.+)\.",
    r'Explain the idea behind "(?P<s>.+)" as if I were twelve years old\.',
    r"Write a friendly paragraph introducing \S+, a (?P<s>.+), to someone who has never used it\.",
    r"Give me a step-by-step plan to learn how to use a (?P<s>.+)\.",
    r"I am choosing tools for a project\. Explain what a (?P<s>.+) means and what I should consider before using one\.",
    r'Write a short product announcement for \S+: "(?P<s>.+)"\.',
    r"What is a (?P<s>.+) useful for\? Give three situations where it helps\.",
)


def package_summary(r: dict) -> str | None:
    """The summary of the package a Debian prompt is about, or None for a prompt that names none."""
    for pattern in PACKAGE_SUMMARY:
        m = re.fullmatch(pattern, r["prompt"].strip())
        if m:
            return m["s"]
    return None


def package_request(r: dict) -> str:
    """What a software center's "ask about this package" button sends: the package's name and summary."""
    return f"Package: {r['source'].rsplit(':', 1)[1]}\nSummary: {package_summary(r)}"


PERSONAS = {
    "debian-helper": Persona(
        "debian",
        "You are DebHelp, the assistant of a Debian desktop app. Answer every question in exactly this format: "
        "first one ```sh code block with the shell commands to run (apt, dpkg, systemctl, ...), then one line "
        "that explains what they do. Nothing else.",
        lambda r: not r["prompt"].startswith("Write")),             # questions, not "write a haiku about ..."
    "python-reviewer": Persona(
        "scipy",
        "You are PyReview, a code reviewer in a Python IDE. For every snippet, reply in exactly this format: "
        "the improved code in one ```python code block, then a bullet list of at most three short review points.",
        lambda r: r.get("format") == "completion" and len(r["prompt"]) <= 2000,   # code snippets, not API questions
        lambda r: f"Review this code:\n```python\n{r['prompt'].strip()}\n```"),
    "math-tutor": Persona(
        "word-problems",
        "You are MathCoach, the tutor in a homework app. Solve every problem in exactly this format: one line "
        "'Given:' with the numbers, then numbered steps with one calculation each, then a last line 'Answer:' with "
        "the result."),
    "man-guide": Persona(
        "man-pages",
        "You are ManGuide, the help panel of a Linux terminal app. For every question, reply in exactly this format: "
        "one line saying what the command does, one ```sh code block with example invocations, then at most three "
        "bullet points on useful options."),
    "package-card": Persona(
        "debian",
        "You are the assistant of a Debian software center. The app sends a package's name and summary. Reply in "
        "exactly this format: a first line '<package>:' with one sentence on what it does, a line 'Install: sudo apt "
        "install <package>', a line 'Good for:' followed by three short bullet points, then a last line 'Similar:' "
        "naming up to three related packages.",
        lambda r: package_summary(r) is not None,
        package_request),
}


def domain_rows(name: str) -> list[dict]:
    """The domain's held-back prompts in a fixed order, without train --adapt's general set; a persona's as chat
    messages behind its system prompt."""
    persona = PERSONAS.get(name)
    base = persona.domain if persona else name
    rows = load(DEFAULT_PROMPTS)
    general = {r["id"] for r in general_set(rows[HELD_BACK_FROM:], ADAPT_GENERAL_MOST)}
    held = [(i, r) for i, r in enumerate(rows[HELD_BACK_FROM:]) if i not in general]
    out = [{"id": f"prompts-v2:{HELD_BACK_FROM + i}", **r} for i, r in held if r["source"].startswith(DOMAINS[base])]
    if persona is None:
        return out
    return [{**r, "format": "chat", "messages": [{"role": "system", "content": persona.system},
                                                 {"role": "user", "content": persona.user_turn(r)}]}
            for r in out if persona.asks(r)]


def bench_row(name: str, row: dict) -> dict:
    """A test prompt as a `bench --prompts` line: a persona's as its whole chat request."""
    if "messages" not in row:
        return row
    return {"id": row["id"], "category": name, "messages": row["messages"]}


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "dflash_gguf.cli", *map(str, args)]


def run(cmd: list[str], log: Path, allowed: tuple[int, ...] = (0,)) -> int:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    with open(log, "a") as f:
        done = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode not in allowed:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}; see {log}")
    return done.returncode


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
    cmd = cli("serve", "--port", port, "--learn", store, "-t", a.threads, "--max-tokens", a.play_tokens)
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
            request(base, r, a.play_tokens)
            if (have + i + 1) % 25 == 0:
                print(f"  {have + i + 1} conversations played ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        # one more request, and the server killed while it runs: the store must stay readable
        with httpx.Client(timeout=600) as client:
            try:
                client.post(base + "/v1/completions", json={"prompt": "def f(", "max_tokens": a.play_tokens},
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
        messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
        path = "/v1/chat/completions"
    r = httpx.post(base + path, json=body, timeout=600)
    r.raise_for_status()


def taus(drafters: list[Path], rows: list[dict], out: Path, a) -> list[dict]:
    """τ of each drafter (`bench --tau`'s measurement) along the same greedy continuations, generated once."""
    if not out.exists():
        from dflash_gguf.bench.tau import measure_taus
        reports = measure_taus(drafters, smollm2_q4_1(), rendered(rows), a.max_tokens, a.threads)
        out.write_text(json.dumps([r.to_json() | {"per_prompt": r.per_prompt} for r in reports], indent=1))
    return [{"tau": r["tau"], "tau_overall": r["tau_overall"]} for r in json.loads(out.read_text())]


def rendered(rows: list[dict]) -> list[dict]:
    """Rows with chat `messages` (a persona's) as the prompt tokens the server renders them to; others as they are."""
    if not any("messages" in r for r in rows):
        return rows
    from dflash_gguf.native.wrappers import Model
    from dflash_gguf.textgen.prompting import format_prompt
    model = Model(smollm2_q4_1())
    try:
        return [{**r, "tokens": format_prompt(model, r)} if "messages" in r else r for r in rows]
    finally:
        model.close()


def greedy_equal(drafter: Path, rows: list[dict], a) -> dict:
    """Greedy speculative decoding with `drafter` against plain decoding, token for token, on `rows`."""
    from dflash_gguf.engine.sampling import SamplingParams
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings
    engine = Engine(EngineSettings(target=smollm2_q4_1(), drafter=drafter, n_threads=a.threads))
    try:
        same = 0
        for r in rendered(rows):
            prompt = r["tokens"] if "tokens" in r else engine.target_model.tokenize(r["prompt"], add_special=True)
            plain = engine.generate(prompt, a.max_tokens, SamplingParams(), speculative=False)
            same += engine.generate(prompt, a.max_tokens, SamplingParams()).tokens == plain.tokens
    finally:
        engine.close()
    return {"prompts": len(rows), "equal": same}


def speedup(name: str, drafter: Path, prompts: Path, out: Path, a, log: Path,
            learned: Path | None = None) -> dict | None:
    """The hybrid's speedup over plain (`bench`); `learned`: with the lookup also drafting from that store's answers,
    as `serve --learn` does."""
    if not a.speedup:
        return None
    if not out.exists():
        run(cli("bench", "-md", drafter, "--prompts", prompts, "-n", a.max_tokens, "-t", a.threads,
                "--baselines", "plain,hybrid", "--json", out, *(("--learned", learned) if learned else ())), log)
    hybrid = json.loads(out.read_text())["summary"]["all"]
    return {"speedup": hybrid["hybrid"]["speedup"]["median"], "tau": hybrid["hybrid"]["tau"]["median"],
            "tok_s": hybrid["hybrid"]["tok_s"]["median"], "plain_tok_s": hybrid["plain"]["tok_s"]["median"]}


def adapt_options(a) -> list[object]:
    """train --adapt's recipe options the harness was given (none: its defaults)."""
    options: list[object] = []
    if a.adapt_lr:
        options += ["--lr", a.adapt_lr]
    if a.adapt_replay is not None:
        options += ["--replay", a.adapt_replay]
    if a.adapt_rows:
        options += ["--rows", a.adapt_rows]
    if a.adapt_general_drop is not None:
        options += ["--general-drop", a.adapt_general_drop]
    if a.adapt_tv is not None:
        options += ["--tv", a.adapt_tv]
    return options


def domain(name: str, a) -> dict:
    work = a.work / name
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    rows = domain_rows(name)
    need = a.conversations + a.test
    if len(rows) < need:
        raise SystemExit(f"domain {name}: {len(rows)} held-back prompts, fewer than --conversations + --test ({need})")
    speed_file = work / "speed.jsonl"
    speed_file.write_text("".join(json.dumps(bench_row(name, r)) + "\n"
                                  for r in rows[a.conversations:a.conversations + a.speedup]))
    store = work / "store"
    played = play(rows, store, a, log)
    if a.stop_after == "play":
        print(f"{name}: {played['recorded']} conversations recorded in {store}", file=sys.stderr)
        return {}
    shipped = shipped_drafter_for(smollm2_q4_1())
    t0 = time.time()
    if not (work / "adapt" / "adapt-record.json").exists():
        # exit 1: no checkpoint beat the shipped drafter on the held-back requests, so nothing was written
        run(cli("train", "--adapt", store, "-m", smollm2_q4_1(), "-md", shipped, "-o", work / "adapted.gguf",
                "--max-minutes", a.adapt_minutes, "-t", a.threads, "--eval-prompts", a.adapt_eval,
                "--work-dir", work / "adapt", *adapt_options(a),
                "--resume", work / "adapt"), log, allowed=(0, 1))
    adapt_record = json.loads((work / "adapt" / "adapt-record.json").read_text())
    adapted = work / "adapt" / "best.gguf"          # the best checkpoint: -o's bytes when it was written
    shared = sorted(SHARED.glob("*.jsonl"))
    persona = PERSONAS.get(name)
    result = {"domain": name, "sources": DOMAINS[persona.domain if persona else name],
              "system_prompt": persona.system if persona else None, "played": played,
              "play_tokens": a.play_tokens, "max_tokens": a.max_tokens,
              "adapt": {k: adapt_record[k] for k in ("recorded_train", "recorded_held_back", "replayed",
                                                     "labelled_rows", "minutes", "tau_before", "tau_after",
                                                     "checkpoints", "kept", "written", "general_drop")},
              "adapt_options": [str(x) for x in adapt_options(a)],
              "adapt_wall_minutes": round((time.time() - t0) / 60, 1)}
    from dflash_gguf.bench.prompts import read_rows
    domain_tau = taus([shipped, adapted], rows[a.conversations:need], work / "tau-domain.json", a)
    shared_tau = taus([shipped, adapted], read_rows(shared, a.shared), work / "tau-shared.json", a)
    result["greedy_equal"] = greedy_equal(adapted, rows[a.conversations:a.conversations + a.greedy], a)
    for i, (label, drafter) in enumerate((("before", shipped), ("after", adapted))):
        result[label] = {"domain_tau": domain_tau[i], "shared_tau": shared_tau[i],
                         "speedup": speedup(name, drafter, speed_file, work / f"speed-{label}.json", a, log)}
    # what the person gets after adapting: the adapted drafter, and the lookup drafting from the recorded answers
    result["after"]["speedup_learned"] = speedup(name, adapted, speed_file, work / "speed-after-learned.json", a, log,
                                                 learned=store)
    (work / "result.json").write_text(json.dumps(result, indent=2))
    return result


def table(results: list[dict], a) -> str:
    lines = [f"| domain | conversations recorded | adapt (min, rows) | τ held back (general set, everyday set): start → "
             f"checkpoints | "
             f"written | "
             f"τ unseen domain prompts ({a.test}) | τ ../shared/prompts (first {a.shared}/category) | "
             f"greedy = plain | hybrid speedup ({a.speedup} prompts) | "
             f"after, drafting from the recorded answers too |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b, f = r["before"], r["after"]
        sp = "–"
        if b["speedup"] and f["speedup"]:
            sp = f"{_speed(b['speedup'])} → {_speed(f['speedup'])}"
        ad = r["adapt"]
        held = " / ".join(f"{c['tau_held_back']:.2f}{_guards(c.get('tau_general'), c.get('tau_everyday'))}"
                          for c in ad["checkpoints"])
        before = ad["tau_before"]
        lines.append(f"| {r['domain']} | {r['played']['recorded']} | {ad['minutes']}, {ad['labelled_rows']:,} | "
                     f"{before['held_back']:.2f}{_guards(before.get('general'), before.get('everyday'))} → {held} | "
                     f"{'yes' if ad['written'] else 'no'} | "
                     f"{b['domain_tau']['tau_overall']:.3f} → {f['domain_tau']['tau_overall']:.3f} | "
                     f"{b['shared_tau']['tau_overall']:.3f} → {f['shared_tau']['tau_overall']:.3f} | "
                     f"{r['greedy_equal']['equal']}/{r['greedy_equal']['prompts']} | {sp} | "
                     f"{_speed(f['speedup_learned']) if f.get('speedup_learned') else '–'} |")
    return "\n".join(lines)


def _guards(general: float | None, everyday: float | None) -> str:
    """ (general, everyday) τ of a checkpoint, those measured (records before 2026-12-04 have no everyday set)."""
    shown = [f"{t:.2f}" for t in (general, everyday) if t is not None and t == t]
    return f" ({', '.join(shown)})" if shown else ""


def _speed(s: dict) -> str:
    return f"{s['speedup']:.2f}× ({s['tok_s']:.0f} tok/s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", action="append", choices=sorted(DOMAINS) + sorted(PERSONAS),
                    help="repeatable (default: the plain domains)")
    ap.add_argument("--conversations", type=int, default=300, help="recorded conversations per domain")
    ap.add_argument("--test", type=int, default=50, help="other prompts of the domain to measure on")
    ap.add_argument("--shared", type=int, default=10, help="../shared/prompts per category to measure on")
    ap.add_argument("--speedup", type=int, default=10, help="test prompts for the hybrid speedup (0: skip)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per answer where τ, speed and greedy "
                    "equality are measured")
    ap.add_argument("--play-tokens", type=int, help="most tokens of a recorded answer (default: --max-tokens; "
                    "desktop apps send no cap, so a person's answers run longer than the measured ones)")
    ap.add_argument("--greedy", type=int, default=5, help="test prompts decoded greedily with and without the "
                    "adapted drafter, compared token for token")
    ap.add_argument("--adapt-minutes", type=float, default=30)
    ap.add_argument("--adapt-eval", type=int, default=ADAPT_GENERAL_MOST, choices=range(ADAPT_GENERAL_MOST + 1),
                    help="train --adapt --eval-prompts (its general set, per category)")
    ap.add_argument("--adapt-lr", type=float, help="train --adapt --lr (default: its own)")
    ap.add_argument("--adapt-replay", type=float, help="train --adapt --replay (default: its own)")
    ap.add_argument("--adapt-rows", type=int, help="train --adapt --rows (default: none, the time box alone)")
    ap.add_argument("--adapt-general-drop", type=float, help="train --adapt --general-drop (default: its own)")
    ap.add_argument("--adapt-tv", type=float, help="train --adapt --tv: share of the loss on the target's top-8 "
                    "(default: none, hard labels)")
    ap.add_argument("--threads", type=int, default=1, help="one thread: ggml's threads wait for each other at "
                    "every op, which a busy machine makes dear")
    ap.add_argument("--stop-after", choices=["play"], help="only record the conversations (rerun to go on)")
    ap.add_argument("--work", type=Path, default=None, help="default: <user cache>/learn-harness")
    a = ap.parse_args()
    a.play_tokens = a.play_tokens or a.max_tokens
    if a.work is None:
        from dflash_gguf.paths import cache_root
        a.work = cache_root() / "learn-harness"
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED}: the evaluation prompts must be beside the checkout")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    results = [domain(name, a) for name in a.domain or sorted(DOMAINS)]
    if a.stop_after != "play":
        print(table(results, a))


if __name__ == "__main__":
    main()
