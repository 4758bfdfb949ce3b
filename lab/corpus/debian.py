"""Chat prompts seeded by Debian documentation: the English man pages installed on the machine (what a
command does, from its NAME and DESCRIPTION) and the package index's one-line descriptions.

The licence of a man page is its package's (recorded as the package and its copyright file); the package
index is Debian's archive metadata for the `main` (DFSG-free) component.
"""

from __future__ import annotations

import gzip
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

MAN_ROOT = Path("/usr/share/man")
DPKG_INFO = Path("/var/lib/dpkg/info")
SECTIONS = ("man1", "man5", "man7", "man8")


@dataclass(frozen=True)
class ManPage:
    command: str
    section: str
    summary: str          # the NAME line's text after the dash
    description: str      # the first paragraph of DESCRIPTION, roff removed
    package: str


_ROFF_FONT = re.compile(r"\\f[BIRP]|\\f\(..|\\f\[[A-Z]*\]")
_ROFF_ESC = re.compile(r"\\[&|^%]|\\\(em|\\\(en|\\\*\(..|\\\*.|\\s[-+]?\d")


def _plain(line: str) -> str:
    line = _ROFF_FONT.sub("", line)
    line = line.replace("\\-", "-").replace("\\(aq", "'").replace("\\(dq", '"').replace("\\e", "\\")
    line = _ROFF_ESC.sub("", line)
    return re.sub(r"\s+", " ", line).strip()


def parse_man(text: str) -> tuple[str, str] | None:
    """(summary, first description paragraph) from roff source, or None if either is missing."""
    section, summary, desc = None, None, []
    for raw in text.splitlines():
        if raw.startswith(".SH") or raw.startswith(".Sh"):
            section = raw[3:].strip().strip('"').upper()
            if desc:
                break
            continue
        if raw.startswith(".\\\"") or raw.startswith("'\\\""):
            continue
        if raw.startswith("."):
            macro = raw[1:3]
            if section == "DESCRIPTION" and desc and macro in ("PP", "P ", "LP", "IP", "TP", "Pp"):
                break
            if macro in ("B ", "I ", "BR", "IR", "RB", "RI", "BI", "IB"):
                raw = " ".join(p.strip('"') for p in raw.split()[1:])
            else:
                continue
        text_line = _plain(raw)
        if not text_line:
            continue
        if section == "NAME" and summary is None and (" - " in text_line or " -- " in text_line):
            summary = text_line.split(" - ", 1)[-1].split(" -- ", 1)[-1].strip()
        elif section == "DESCRIPTION":
            desc.append(text_line)
    description = " ".join(desc)
    if not summary or len(description) < 60:
        return None
    return summary, description[:700]


def _file_owners() -> dict[str, str]:
    owners = {}
    for lst in DPKG_INFO.glob("*.list"):
        pkg = lst.stem.split(":")[0]
        for line in lst.read_text(errors="replace").splitlines():
            if line.startswith("/usr/share/man/man"):
                owners[line] = pkg
    return owners


def man_pages() -> list[ManPage]:
    owners = _file_owners()
    pages = []
    for sec in SECTIONS:
        for path in sorted((MAN_ROOT / sec).glob("*.gz")):
            if path.is_symlink():
                continue
            try:
                parsed = parse_man(gzip.decompress(path.read_bytes()).decode("utf-8", "replace"))
            except (OSError, EOFError):
                continue
            if parsed:
                command = path.name.removesuffix(".gz").rsplit(".", 1)[0]
                pages.append(ManPage(command, sec[3:], parsed[0], parsed[1], owners.get(str(path), "unknown")))
    return pages


def licence_of(package: str) -> str:
    """The first DEP-5 'License:' of the package's copyright file, else a pointer to that file."""
    path = Path("/usr/share/doc") / package / "copyright"
    try:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("License:") and line[8:].strip():
                return f"{line[8:].strip()} (Debian package {package})"
    except OSError:
        pass
    return f"see /usr/share/doc/{package}/copyright (Debian package {package})"


_MAN_QUESTIONS = [
    "How do I use the `{cmd}` command on Linux? Its manual says: \"{summary}. {desc}\" Give a few practical examples.",
    "Explain to a new Linux user what `{cmd}` ({summary}) is for and when they would need it.",
    "I need to {task}. The man page of `{cmd}` says: \"{desc}\" Walk me through it step by step.",
    "What are the most useful options of `{cmd}`? Here is its description: \"{desc}\"",
    "Write a short tutorial about `{cmd}`: {summary}.",
    "Summarize this manual page in three bullet points: \"{desc}\"",
]


def man_rows(pages: list[ManPage], rng) -> list[dict]:
    rows = []
    for p in pages:
        q = rng.choice(_MAN_QUESTIONS).format(cmd=p.command, summary=p.summary.rstrip("."), desc=p.description,
                                              task=p.summary[0].lower() + p.summary[1:].rstrip("."))
        rows.append({"category": "chat", "format": "chat", "source": f"debian-man:{p.package}:{p.command}.{p.section}",
                     "licence": licence_of(p.package), "prompt": q})
    return rows


def package_index() -> list[tuple[str, str, str]]:
    """(package, section, one-line description) for every package apt knows."""
    out = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    rows = []
    for stanza in out.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if "Package" in fields and "Description" in fields:
            rows.append((fields["Package"], fields.get("Section", "misc"), fields["Description"].strip()))
    return rows


_PACKAGE_QUESTIONS = [
    "What is {desc_l} useful for? Give three situations where it helps.",
    "Write a friendly paragraph introducing {pkg}, {desc_l}, to someone who has never used it.",
    "I am choosing tools for a project. Explain what {desc_l} means and what I should consider before using one.",
    "Write a short product announcement for {pkg}: \"{desc}\".",
    "Explain the idea behind \"{desc}\" as if I were twelve years old.",
    "What questions should I ask before installing {pkg} ({desc_l})?",
    "Write a haiku and then a one-sentence explanation about {desc_l}.",
    "Give me a step-by-step plan to learn how to use {desc_l}.",
]


def package_rows(index: list[tuple[str, str, str]], rng) -> list[dict]:
    rows = []
    for pkg, section, desc in index:
        if len(desc) < 12 or pkg.startswith(("lib", "golang-", "node-", "r-cran-", "ruby-", "php-", "texlive")):
            continue
        desc_l = desc[0].lower() + desc[1:] if not desc[:2].isupper() else desc
        q = rng.choice(_PACKAGE_QUESTIONS).format(pkg=pkg, desc=desc, desc_l=f"a {desc_l}" if desc_l[0] != "a" else desc_l)
        rows.append({"category": "chat", "format": "chat", "source": f"debian-packages:{section}:{pkg}",
                     "licence": "Debian bookworm main package index (DFSG-free archive metadata)", "prompt": q})
    return rows
