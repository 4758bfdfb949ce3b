"""Prompts from real Python source: every documented function becomes a HumanEval-style completion
(signature + docstring, the body left to the model) and, for a share, a question about that API.

Sources: the standard library (PSF-2.0) and the installed distributions whose metadata names a licence.
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Iterator

SKIP_PARTS = {"test", "tests", "testing", "idlelib", "lib2to3", "turtledemo", "_vendor", "vendored", "examples"}
MAX_DOC_CHARS = 900
MAX_DOC_LINES = 24


@dataclass(frozen=True)
class DocumentedFunction:
    package: str
    licence: str
    module: str            # dotted module path
    qualname: str          # Class.method or function
    source: str            # the signature and docstring, as a completion prompt
    doc: str


def _licence(dist: metadata.Distribution) -> str | None:
    md = dist.metadata
    expr = md.get("License-Expression")
    if expr:
        return expr.strip()
    short = (md.get("License") or "").strip()
    if short and len(short) <= 40 and "\n" not in short and short.upper() not in {"UNKNOWN", "NONE"}:
        return short
    for c in md.get_all("Classifier") or []:
        if c.startswith("License :: OSI Approved :: "):
            return c.rsplit(" :: ", 1)[1]
    return None


def python_roots(extra_paths: list[Path] = ()) -> Iterator[tuple[str, str, Path, list[Path]]]:
    """(package, licence, base dir, .py files) for the standard library and each licensed distribution,
    installed or unpacked from a wheel into one of `extra_paths`."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py"))
    yield "cpython", "PSF-2.0", stdlib, [f for f in files if "site-packages" not in f.parts]
    seen = set()
    dists = list(metadata.distributions()) + list(metadata.distributions(path=[str(p) for p in extra_paths]))
    for dist in sorted(dists, key=lambda d: (d.metadata["Name"] or "").lower()):
        name = (dist.metadata["Name"] or "").lower()
        licence = _licence(dist)
        if not name or name in seen or not licence or name.startswith("dflash"):
            continue
        seen.add(name)
        base = Path(dist.locate_file(""))
        py = [base / str(f) for f in (dist.files or []) if str(f).endswith(".py")]
        if py:
            yield name, licence, base, py


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    kw = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{kw} {node.name}({ast.unparse(node.args)}){ret}:"


def _usable_doc(doc: str | None) -> bool:
    if not doc or not 40 <= len(doc) <= MAX_DOC_CHARS or len(doc.splitlines()) > MAX_DOC_LINES:
        return False
    return doc.isascii() and "\n\n\n" not in doc


def _prompt(sig: str, doc: str, indent: str) -> str:
    body = "\n".join((indent + "    " + line) if line else "" for line in doc.splitlines())
    return f"{indent}{sig}\n{indent}    \"\"\"{body.lstrip()}\n{indent}    \"\"\"\n"


def functions_in(text: str, module: str, package: str, licence: str) -> Iterator[DocumentedFunction]:
    """Public documented functions and methods of one module, each cut as a completion prompt."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if _usable_doc(doc):
                yield DocumentedFunction(package, licence, module, node.name,
                                         "\n" + _prompt(_signature(node), doc, ""), doc)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                    doc = ast.get_docstring(item)
                    if _usable_doc(doc):
                        src = f"\nclass {node.name}:\n    ...\n\n" + _prompt(_signature(item), doc, "    ")
                        yield DocumentedFunction(package, licence, module, f"{node.name}.{item.name}", src, doc)


def documented_functions(max_per_package: int, rng, extra_paths: list[Path] = ()) -> list[DocumentedFunction]:
    """Up to max_per_package functions from each package, sampled so that big packages do not dominate."""
    out = []
    for package, licence, base, files in python_roots(extra_paths):
        found = []
        for path in files:
            rel = path.relative_to(base) if path.is_relative_to(base) else Path(path.name)
            if any(p in SKIP_PARTS for p in rel.parts):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            found.extend(functions_in(text, module, package, licence))
        rng.shuffle(found)
        out.extend(found[:max_per_package])
    return out


_API_QUESTIONS = [
    "What does `{name}` from the Python package `{package}` do? Its documentation says:\n\n{doc}\n\n"
    "Explain it in plain words and show a short example of calling it.",
    "I am reading code that calls `{name}` ({package}). The docstring is:\n\n{doc}\n\nWhen would I use it, "
    "and what should I watch out for?",
    "Write a small Python script that uses `{name}` from `{package}`. For reference, its docstring:\n\n{doc}",
    "Explain the parameters of `{name}` ({package}) to a beginner, based on this documentation:\n\n{doc}",
]


def code_rows(functions: list[DocumentedFunction]) -> list[dict]:
    return [{"category": "code", "format": "completion", "source": f"{f.package}:{f.module}:{f.qualname}",
             "licence": f.licence, "prompt": f.source} for f in functions]


def api_question_rows(functions: list[DocumentedFunction], rng) -> list[dict]:
    rows = []
    for f in functions:
        q = rng.choice(_API_QUESTIONS).format(name=f"{f.module}.{f.qualname}", package=f.package, doc=f.doc.strip())
        rows.append({"category": "chat", "format": "chat", "source": f"{f.package}:{f.module}:{f.qualname}",
                     "licence": f.licence, "prompt": q})
    return rows
