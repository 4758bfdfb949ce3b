"""Training prompts from text with a clear licence, never from the evaluation prompts.

- code: signatures + docstrings of functions in CPython's standard library (PSF License 2.0),
  continued as raw completions (the HumanEval format).
- math: synthetic grade-school word problems from templates written for this project (MIT).
- chat: instructions from templates over stdlib module summaries and topic lists (MIT / PSF).
"""

from __future__ import annotations

import ast
import gzip
import json
import random
import sysconfig
from pathlib import Path


def code_prompts(limit: int, rng: random.Random) -> list[dict]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(lib.glob("*.py")) + sorted(lib.glob("*/*.py")):
        if any(part in {"test", "tests", "idlelib", "lib2to3", "turtledemo"} for part in path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and 40 <= len(doc) <= 600 and "\n\n\n" not in doc:
                    args = ast.unparse(node.args)
                    body = "\n    ".join(doc.splitlines())
                    out.append({"category": "code", "source": f"cpython:{path.relative_to(lib)}:{node.name}",
                                "prompt": f"\ndef {node.name}({args}):\n    \"\"\"{body}\n    \"\"\"\n"})
    rng.shuffle(out)
    return out[:limit]


_NAMES = ["Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Luis", "Mei",
          "Noah", "Olu", "Priya", "Quinn", "Rosa", "Sami", "Tara"]
_MATH = [
    "{a} has {x} {item}s. {a} buys {y} packs with {z} {item}s in each pack and gives {w} {item}s to {b}. How many {item}s does {a} have now?",
    "A shop sells {item}s for ${x} each. {a} buys {y} {item}s and pays with a ${z}0 bill. How much change does {a} get?",
    "{a} reads {x} pages every weekday and {y} pages on each weekend day. How many pages does {a} read in {z} weeks?",
    "A train travels at {x} miles per hour for {y} hours, then at {z} miles per hour for {w} hours. How far does it travel in total?",
    "{a} earns ${x} per hour and works {y} hours a day for {z} days. After spending ${w}, how much money is left?",
    "There are {x} students in a class. {y} percent of them play soccer, and half of the rest play chess. How many students play chess?",
    "{a} baked {x} {item}s. {b} ate {y} of them and {a} packed the rest equally into {z} boxes. How many {item}s are in each box (rounded down)?",
    "A garden is {x} meters long and {y} meters wide. Fencing costs ${z} per meter. How much does it cost to fence the whole garden?",
    "{a} is {x} years old. {b} is {y} years older than twice {a}'s age. How old will {b} be in {z} years?",
    "A recipe needs {x} cups of flour for {y} muffins. How many cups of flour are needed for {z} muffins?",
    "{a} saves ${x} in the first month and ${y} more than the previous month every month after. How much has {a} saved after {z} months?",
    "A tank holds {x} liters. It leaks {y} liters per hour while a pump adds {z} liters per hour. How many hours until it holds {w} more liters?",
]
_ITEMS = ["apple", "pencil", "sticker", "cookie", "marble", "book", "card", "shell", "stamp", "cupcake"]


def math_prompts(n: int, rng: random.Random) -> list[dict]:
    out = []
    for i in range(n):
        t = _MATH[i % len(_MATH)]
        a, b = rng.sample(_NAMES, 2)
        q = t.format(a=a, b=b, item=rng.choice(_ITEMS), x=rng.randint(2, 60), y=rng.randint(2, 30),
                     z=rng.randint(2, 12), w=rng.randint(1, 20))
        out.append({"category": "math", "source": "synthetic-template", "prompt": q})
    return out


_TOPICS = ["photosynthesis", "the water cycle", "binary search", "compound interest", "the French Revolution",
           "recursion", "vaccines", "black holes", "supply and demand", "climate change", "the immune system",
           "public key cryptography", "machine learning", "the Roman Empire", "plate tectonics", "sleep",
           "time management", "healthy eating", "learning a new language", "remote work", "electric cars",
           "the stock market", "volcanoes", "renewable energy", "the internet", "chess openings", "meditation"]
_CHAT = ["Explain {t} to a beginner in a few paragraphs.", "Give me five practical tips about {t}.",
         "Write a short story in which {t} plays an important role.", "What are the pros and cons of {t}?",
         "Summarize the key ideas of {t} in a bulleted list.", "Write a friendly email to a colleague about {t}.",
         "Compose a short poem about {t}.", "What are common misconceptions about {t}?",
         "Create a one-week study plan to learn about {t}.", "Describe {t} as if you were a tour guide."]


def chat_prompts(n: int, rng: random.Random) -> list[dict]:
    out = []
    lib = Path(sysconfig.get_paths()["stdlib"])
    modules = []
    for path in sorted(lib.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if doc and len(doc.splitlines()[0]) > 20:
            modules.append((path.stem, doc.splitlines()[0].strip()))
    for i in range(n):
        if i % 3 == 0 and modules:
            name, line = rng.choice(modules)
            q = f"I am learning Python. What is the `{name}` module for (\"{line}\")? Show a small example."
            src = f"cpython:{name}"
        elif i % 3 == 1:
            t1, t2 = rng.sample(_TOPICS, 2)
            q = rng.choice(["Compare {a} and {b}: how are they alike and how do they differ?",
                            "Write a short dialogue between two friends, one curious about {a}, the other about {b}.",
                            "How could ideas from {a} help someone understand {b}?"]).format(a=t1, b=t2)
            src = "synthetic-template"
        else:
            q = rng.choice(_CHAT).format(t=rng.choice(_TOPICS))
            src = "synthetic-template"
        out.append({"category": "chat", "source": src, "prompt": q})
    return out


def build(n_code: int, n_math: int, n_chat: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = code_prompts(n_code, rng) + math_prompts(n_math, rng) + chat_prompts(n_chat, rng)
    seen, out = set(), []
    for r in rows:
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            out.append(r)
    rng.shuffle(out)
    return out


def load(path: Path) -> list[dict]:
    """Rows of a JSONL prompt file (gzip-compressed when its name ends in .gz)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
