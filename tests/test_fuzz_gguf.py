"""Fuzz: mutated copies of the shipped drafter and the embedded target never crash, hang or print a traceback.

Bounded and seeded (same inputs every run). Three layers:
1. in-process: every mutated file goes through the shared validator (gguf_check): it is refused with a
   BadModelFile naming the file, or passes; nothing else may happen;
2. llama.cpp: every file that passed is loaded in a child process, which must survive (a clean load error
   or a loaded model, never an abort);
3. commands: for every mutation class and every command that reads a model, a real `dflash-gguf` process
   on a refused file: exit 1 or 2, one `error:` line naming the file, no traceback, no output file.
The counts printed at the end are the ones reported in the README.
"""

from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dflash_gguf.assets import ASSETS
from dflash_gguf.gguf_check import BadModelFile, check_drafter, check_target
from helpers.gguf_mutations import Mutation, hparam_mutations, mutations, walk

SEED = 20260523
ALWAYS_REFUSED = {"truncation", "huge string lengths", "offsets past the end", "unknown types", "bad values"}
COMMAND_TIMEOUT_S = 120          # a hang: far above the ~2 s a refused file takes


def _sources() -> dict[str, Path]:
    from dflash_gguf.packaged_models import smollm2_q4_1
    return {"target": smollm2_q4_1(), "drafter": ASSETS / "smollm2-135m-instruct.dflash-q8_0.gguf"}


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    """Validate every mutated file in-process; keep the ones that pass and one refused file per class."""
    work = tmp_path_factory.mktemp("fuzz")
    counts: collections.Counter = collections.Counter()
    passed: list[tuple[str, Path, str]] = []                  # (role, file, label)
    refused: dict[tuple[str, str], list[tuple[Path, str]]] = collections.defaultdict(list)
    problems: list[str] = []
    for role, src in _sources().items():
        layout = walk(src)
        head = _head(src, layout.data_start)
        arch = "dflash" if role == "drafter" else "llama"
        cases = mutations(layout, head, SEED, n_truncations=80, n_flips=45) + hparam_mutations(layout, head, arch)
        check = check_drafter if role == "drafter" else check_target
        for i, m in enumerate(cases):
            path = m.write(head, layout, work / f"{role}-{i:03d}.gguf")
            try:
                check(path)
            except BadModelFile as e:
                counts[(role, m.cls, "refused")] += 1
                if not str(e).startswith(str(path)):
                    problems.append(f"{m.cls} / {m.label}: message does not name the file: {e}")
                refused[(role, m.cls)].append((path, m.label))
                continue
            except Exception as e:  # noqa: BLE001 - exactly what must never happen
                problems.append(f"{role} {m.cls} / {m.label}: {type(e).__name__}: {e}")
                continue
            counts[(role, m.cls, "passed")] += 1
            if m.cls in ALWAYS_REFUSED:
                problems.append(f"{role} {m.cls} / {m.label}: passed validation")
            passed.append((role, path, m.label))
    # keep one refused file per (role, class) for the commands, the rest can go
    rng = random.Random(SEED)
    keep = {key: rng.choice(files) for key, files in refused.items()}
    for key, files in refused.items():
        for path, _ in files:
            if path != keep[key][0]:
                path.unlink()
    return {"work": work, "counts": counts, "passed": passed, "refused": keep, "problems": problems}


def test_the_validator_refuses_or_passes_every_mutated_file_and_names_it(fuzz):
    assert not fuzz["problems"], "\n".join(fuzz["problems"][:20])
    counts = fuzz["counts"]
    total = sum(counts.values())
    assert total >= 500
    for role in ("target", "drafter"):
        classes = {cls for (r, cls, _) in counts if r == role}
        assert classes >= ALWAYS_REFUSED | {"header flips", "tensor-info flips", "wrong counts", "value changes"}
    _report(fuzz)


def test_files_that_pass_validation_do_not_make_llama_cpp_abort(fuzz, tmp_path):
    """Load each in one child process, one after the other; a GGML_ASSERT would kill it (a signal)."""
    files = fuzz["passed"]
    assert files, "no mutated file passed validation: the flips never hit a harmless byte"
    listing = tmp_path / "files.json"
    listing.write_text(json.dumps([str(p) for _, p, _ in files]))
    script = ("import json, sys\n"
              "from dflash_gguf.native.wrappers import Model, ModelLoadError\n"
              "for p in json.load(open(sys.argv[1])):\n"
              "    print('loading', p, flush=True)\n"
              "    try:\n"
              "        Model(p).close(); print('loaded', flush=True)\n"
              "    except ModelLoadError:\n"
              "        print('refused', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", script, str(listing)], capture_output=True, text=True,
                       timeout=COMMAND_TIMEOUT_S * 2)
    last = [line for line in r.stdout.splitlines() if line.startswith("loading")][-1:]
    assert r.returncode == 0, f"llama.cpp died ({r.returncode}) on {last}: {r.stderr[-2000:]}"
    outcomes = collections.Counter(line for line in r.stdout.splitlines() if line in ("loaded", "refused"))
    assert sum(outcomes.values()) == len(files)
    fuzz["llama"] = outcomes
    print(f"\nllama.cpp on the {len(files)} files that passed validation: {dict(outcomes)}")


def _models_home(tmp: Path, bad: Path) -> dict:
    """An HF cache holding just `bad`, so `dflash-gguf models` must read its header."""
    snap = tmp / "hub" / "models--fuzz--bad" / "snapshots" / "0"
    snap.mkdir(parents=True, exist_ok=True)
    for old in snap.glob("*.gguf"):
        old.unlink()
    os.link(bad, snap / bad.name)
    return {"HF_HUB_CACHE": str(tmp / "hub"), "HOME": str(tmp), "JAN_DATA_FOLDER": str(tmp / "jan")}


def _command_cases(fuzz, tmp: Path) -> list[tuple[str, str, Path, list[str], dict]]:
    """(command, class, mutated file, argv, extra env) — every command that reads a model, every class."""
    src = _sources()
    T, D = str(src["target"]), str(src["drafter"])
    prompts = tmp / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    out = str(tmp / "out.gguf")
    cases = []
    classes = sorted({cls for (_, cls) in fuzz["refused"]})
    for i, cls in enumerate(classes):
        t = fuzz["refused"].get(("target", cls), (None,))[0]
        d = fuzz["refused"].get(("drafter", cls), (None,))[0]
        pick_drafter = d is not None and (i % 2 == 1 or t is None)
        bad = d if pick_drafter else t

        def flag(model_flag: str, drafter_flag: str) -> list[str]:
            return [drafter_flag, str(bad)] if pick_drafter else [model_flag, str(bad)]

        cases += [
            ("run", cls, bad, ["run", *flag("-m", "-md"), "-p", "hi", "-n", "2", "--no-compare"], {}),
            ("bench", cls, bad, ["bench", *flag("-m", "-md"), "--prompts", str(prompts), "-n", "2"], {}),
            ("serve", cls, bad, ["serve", *flag("-m", "-md"), "--port", "1"], {}),
            ("convert", cls, bad, ["convert", str(bad), "--target", T, "-o", out] if pick_drafter
             else ["convert", D, "--target", str(bad), "-o", out], {}),
            ("inspect", cls, bad, ["inspect", str(bad), "--target", T] if pick_drafter
             else ["inspect", D, "--target", str(bad)], {}),
        ]
        if t is not None:
            cases.append(("train", cls, t, ["train", "-m", str(t), "-o", out], {}))
        models_dir = tmp / f"models-{i}"
        cases.append(("models", cls, bad, ["models"], _models_home(models_dir, bad)))
    return cases


def _run(case) -> tuple:
    command, cls, bad, argv, env = case
    full_env = {**os.environ, **env, "DFLASH_GGUF_DEBUG": "0"}
    try:
        r = subprocess.run([sys.executable, "-m", "dflash_gguf.cli", *argv], capture_output=True, text=True,
                           timeout=COMMAND_TIMEOUT_S, env=full_env)
    except subprocess.TimeoutExpired:
        return case, None
    return case, r


def test_every_command_refuses_every_mutation_class_in_one_line(fuzz, tmp_path):
    cases = _command_cases(fuzz, tmp_path)
    commands = {c[0] for c in cases}
    assert commands == {"run", "bench", "serve", "convert", "inspect", "train", "models"}
    failures, outcomes = [], collections.Counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for (command, cls, bad, argv, _), r in pool.map(_run, cases):
            what = f"{command} [{cls}] {bad.name}"
            if r is None:
                failures.append(f"{what}: hung for {COMMAND_TIMEOUT_S} s")
                continue
            outcomes[(command, r.returncode)] += 1
            if "Traceback" in r.stderr:
                failures.append(f"{what}: traceback\n{r.stderr[-1500:]}")
            if command == "models":       # a damaged file is listed as unreadable; the listing goes on
                listed = [line for line in r.stdout.splitlines() if bad.name in line]
                if r.returncode != 0 or len(listed) != 1 or "(unreadable)" not in listed[0]:
                    failures.append(f"{what}: exit {r.returncode}, stdout {r.stdout[-500:]!r}")
                continue
            errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
            if r.returncode not in (1, 2) or len(errors) != 1 or bad.name not in errors[0]:
                failures.append(f"{what}: exit {r.returncode}, stderr {r.stderr[-800:]!r}")
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(("out", ".out"))]
    assert not left, f"output left behind: {left}"
    assert not failures, "\n".join(failures)
    fuzz["commands"] = outcomes
    print(f"\ncommands: {len(cases)} runs, exit codes {dict(collections.Counter(c for (_, c) in outcomes.elements()))}")


def _report(fuzz) -> None:
    by_class = collections.defaultdict(lambda: [0, 0])
    for (role, cls, outcome), n in fuzz["counts"].items():
        by_class[(role, cls)][outcome == "passed"] += n
    print("\nmutated files (role, class: refused / passed validation):")
    for (role, cls), (refused, passed) in sorted(by_class.items()):
        print(f"  {role:8s} {cls:22s} {refused:4d} / {passed}")
    print(f"  total {sum(fuzz['counts'].values())}")


def test_mutation_classes_are_reproducible():
    """Same seed, same inputs: the suite is deterministic."""
    src = _sources()["drafter"]
    layout = walk(src)
    head = _head(src, layout.data_start)
    a = mutations(layout, head, SEED, n_truncations=20, n_flips=5)
    b = mutations(layout, head, SEED, n_truncations=20, n_flips=5)
    assert [(m.cls, m.label, m.patches, m.size) for m in a] == [(m.cls, m.label, m.patches, m.size) for m in b]
    assert all(isinstance(m, Mutation) for m in a)
