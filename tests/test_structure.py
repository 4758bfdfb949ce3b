"""The package's shape: every module serves a command, and no two modules import each other, even through others.

Read from the source (imports at any depth of a file, relative or absolute), so a module that only tests or
`lab/` use, or an import cycle that a lazy import hides, fails here rather than in a newcomer's reading.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_gguf"
ENTRY = "dflash_gguf.cli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(path: Path, name: str) -> set[str]:
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]) if node.level else node.module
            base = base.rstrip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("dflash_gguf."):
            found.add(f"{node.value}:")  # importlib.import_module("dflash_gguf.x"), how the CLI registers commands
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for imported in _imported_names(path, name):
            if imported.endswith(":"):      # a string names a module only as a whole (not "dflash_gguf.train.x" keys)
                targets.update({imported[:-1]} & set(files))
                continue
            parts = imported.split(".")
            known = [".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in files]
            targets.update(known[:1])       # the module itself, not the packages Python passes on the way
        graph[name] = targets - {name}
    return graph


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def test_every_module_is_reached_from_the_command_line():
    graph = import_graph()
    reached = _reached(graph, ENTRY)
    packages_on_the_way = {name.rsplit(".", i)[0] for name in reached for i in range(1, name.count(".") + 1)}
    unreached = sorted(set(graph) - reached - packages_on_the_way)
    assert not unreached, f"modules no command reaches (move them to lab/ or tests/helpers/): {unreached}"


def test_no_import_cycles():
    graph = import_graph()
    reach = {name: _reached(graph, name) for name in graph}
    cycles = sorted({tuple(sorted(n for n in reach[a] if a in reach[n])) for a in graph
                     if any(a in reach[b] for b in graph[a])})
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


COMMAND_AREAS = {"cli", "server", "bench", "train", "convert"}


def _area(name: str) -> str:
    return name.split(".")[1] if "." in name else ""


def test_data_flows_from_the_commands_down_to_native():
    """cli -> engine -> native: nothing imports the CLI, the engine and the layers below it import no command,
    and native only errors and paths."""
    graph = import_graph()
    upward = sorted((a, b) for a in graph for b in graph[a] if _area(b) == "cli" and _area(a) != "cli"
                    or _area(a) not in COMMAND_AREAS and _area(b) in COMMAND_AREAS
                    or _area(a) == "native" and _area(b) not in {"native", "errors", "paths", ""})
    assert not upward, f"imports that run back up a layer: {upward}"


def test_the_checks_see_imports():
    graph = import_graph()
    assert "dflash_gguf.engine.session" in _reached(graph, ENTRY)
    assert "dflash_gguf.native.wrappers" in graph["dflash_gguf.engine.target"] | _reached(graph, "dflash_gguf.engine.target")


def test_the_torch_reference_shares_no_class_name_with_the_engine():
    def classes(folder: str) -> set[str]:
        return {node.name for path in (PACKAGE / folder).rglob("*.py")
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)}
    assert classes("drafter") and classes("engine")
    assert not classes("drafter") & classes("engine"), "a reader of a traceback cannot tell which one ran"
