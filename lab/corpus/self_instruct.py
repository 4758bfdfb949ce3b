"""Questions the target writes itself from real seeds: it is asked for one question (or one math word
problem) about a seed taken from the other sources, and its greedy answer becomes a training prompt.
Its own phrasing is what the drafter will meet most, and the seeds keep the topics diverse."""

from __future__ import annotations

import re

_ASK_QUESTION = ("Here is a short description of a piece of software: \"{seed}\". Write one question that a "
                 "curious user might ask an assistant about it or about the topic behind it. Reply with the "
                 "question only.")
_ASK_PROBLEM = ("Write one short math word problem for a middle-school student about {seed}. It must need two "
                "or three steps of arithmetic to solve. Reply with the problem only, without the answer.")


def instruction_rows(seeds: list[tuple[str, str, str]], kind: str, rng) -> list[dict]:
    """Rows asking the target for a question; seeds are (seed text, source, licence)."""
    template = _ASK_QUESTION if kind == "question" else _ASK_PROBLEM
    rows = []
    for text, source, licence in seeds:
        rows.append({"category": "math" if kind == "problem" else "chat", "format": "chat",
                     "source": f"self-instruct:{kind}:{source}", "licence": licence,
                     "prompt": template.format(seed=text)})
    return rows


def clean_reply(text: str) -> str | None:
    """The target's reply as a prompt, or None when it is not one usable question/problem."""
    text = text.strip().strip('"').strip()
    text = re.sub(r"^(question|problem|math word problem)\s*\d*\s*:\s*", "", text, flags=re.I)
    if "answer:" in text.lower():
        text = text[:text.lower().index("answer:")].strip()
    if not 25 <= len(text) <= 600 or text.count("\n\n") > 3:
        return None
    return text


def problem_seeds(package_index: list[tuple[str, str, str]], rng, n: int) -> list[tuple[str, str, str]]:
    """Everyday topics for word problems, taken from package descriptions (games, food, sports, ...)."""
    wanted = {"games", "science", "education", "hamradio", "graphics", "sound", "video", "web", "electronics",
              "math", "gnu-r", "misc", "text", "utils", "net"}
    pool = [(desc.rstrip("."), f"debian-packages:{sec}:{pkg}",
             "Debian bookworm main package index (DFSG-free archive metadata)")
            for pkg, sec, desc in package_index if sec in wanted and 12 <= len(desc) <= 80]
    rng.shuffle(pool)
    return [(f"a {d[0].lower()}{d[1:]}" if not d[:2].isupper() else d, s, lic) for d, s, lic in pool[:n]]
