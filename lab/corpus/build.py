"""The training prompt set: real text from every source, mixed, deduplicated and checked against the
evaluation prompts. Stage 2 (`add_self_instructed`) asks the target to write more prompts from seeds."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import debian, python_code, self_instruct, word_problems
from .overlap import EvalFilter

FOLLOWUPS = [
    "Can you make that shorter?", "Please explain it in simpler words.", "Give me one more example.",
    "Can you put that into a numbered list?", "Why is that the case?", "What is a common mistake people make here?",
    "Summarize your answer in one sentence.", "Can you show that as Python code?",
    "Thanks! What should I learn next?", "What would change if I were on Windows instead of Linux?",
    "Could you give a real-world analogy?", "Which part of this is the most important, and why?",
]


@dataclass
class Mix:
    code: int = 10000           # completions cut from real functions
    api_questions: int = 3000   # questions about the same real APIs
    man_pages: int = 3500
    packages: int = 4200
    templates: int = 2000       # template word problems (a small share)
    problem_seeds: int = 1000   # seeds for target-written word problems
    question_seeds: int = 400   # seeds for target-written questions
    multi_turn: int = 1500      # chat rows that get a follow-up user turn
    per_package: int = 600      # documented functions kept per Python distribution
    per_man_package: int = 25   # man pages kept per Debian package


def _spread(items: list, key, cap: int, rng) -> list:
    """At most `cap` items per key, shuffled, so that one big source cannot dominate."""
    rng.shuffle(items)
    seen: Counter = Counter()
    out = []
    for it in items:
        k = key(it)
        if seen[k] < cap:
            seen[k] += 1
            out.append(it)
    return out


def source_rows(mix: Mix, seed: int, eval_prompts: list[str], wheel_dirs: list[Path] = ()
                ) -> tuple[list[dict], list[dict]]:
    """(prompt rows, self-instruct request rows) from the local sources (+ wheels unpacked in wheel_dirs)."""
    rng = random.Random(seed)
    functions = python_code.documented_functions(mix.per_package, rng, wheel_dirs)
    rng.shuffle(functions)
    rows = python_code.code_rows(functions[:mix.code])
    rows += python_code.api_question_rows(functions[mix.code:mix.code + mix.api_questions], rng)
    pages = _spread(debian.man_pages(), lambda p: p.package, mix.per_man_package, rng)
    rows += debian.man_rows(pages[:mix.man_pages], rng)
    index = debian.package_index()
    packages = debian.package_rows(index, rng)
    rng.shuffle(packages)
    rows += packages[:mix.packages]
    rows += word_problems.word_problem_rows(mix.templates, rng)
    chat = [r for r in rows if r["category"] == "chat"]
    for r in rng.sample(chat, min(mix.multi_turn, len(chat))):
        r["followups"] = [rng.choice(FOLLOWUPS)]
    seeds = [(p.summary, f"debian-man:{p.package}:{p.command}", debian.licence_of(p.package))
             for p in pages[mix.man_pages:mix.man_pages + mix.question_seeds]]
    requests = self_instruct.instruction_rows(seeds, "question", rng)
    requests += self_instruct.instruction_rows(self_instruct.problem_seeds(index, rng, mix.problem_seeds), "problem", rng)
    return clean(rows, eval_prompts, seed), requests


def clean(rows: list[dict], eval_prompts: list[str], seed: int) -> list[dict]:
    """Drop duplicates and anything sharing a word n-gram with an evaluation prompt; shuffle."""
    filt = EvalFilter(eval_prompts)
    seen, out = set(), []
    for r in rows:
        if r["prompt"] in seen or filt.overlaps(r["prompt"]):
            continue
        seen.add(r["prompt"])
        out.append(r)
    random.Random(seed).shuffle(out)
    return out


def self_instructed_rows(requests: list[dict], replies: dict[int, str]) -> list[dict]:
    """Rows from the target's replies to the self-instruct requests (index -> reply text)."""
    rows = []
    for i, req in enumerate(requests):
        text = self_instruct.clean_reply(replies.get(i, ""))
        if text:
            rows.append({"category": req["category"], "format": "chat", "source": req["source"],
                         "licence": req["licence"], "prompt": text})
    return rows


def summary(rows: list[dict]) -> dict:
    kinds = Counter(r["source"].split(":")[0] for r in rows)
    return {"rows": len(rows), "by_category": dict(Counter(r["category"] for r in rows)),
            "by_source": dict(kinds), "multi_turn": sum(1 for r in rows if r.get("followups")),
            "licences": len({r["licence"] for r in rows})}
