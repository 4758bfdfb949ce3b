"""Find GGUF targets where desktop apps keep them, and the DFlash drafters that fit each (headers only).

- LM Studio: <models>/<publisher>/<model>/[…/]*.gguf, <models> = ~/.lmstudio/models (the home may be
  moved: ~/.lmstudio-home-pointer), the `downloadsFolder` of its settings.json, or the legacy
  ~/.cache/lm-studio/models.
- Jan: <data folder>/llamacpp/models/<model id>/model.yml (+ the gguf, or `model_path` pointing at it).
  The data folder is `data_folder` in Jan's settings.json (<data dir>/jan.ai.app/, or the legacy
  ~/.config/Jan/ on Linux), else <data dir>/Jan/data; <data dir> is ~/.local/share ($XDG_DATA_HOME) on
  Linux, ~/Library/Application Support on macOS, %APPDATA% on Windows; $JAN_DATA_FOLDER overrides it.
- Hugging Face cache: $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub, models--*/snapshots/*/…
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError

DRAFTER_ARCHS = ("dflash", "dflash-draft", "gemma4-dflash-draft")
_SHARD = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")          # llama.cpp split files: list the first only


@dataclass
class Found:
    source: str                   # lmstudio | jan | huggingface | shipped
    name: str                     # how `serve -m` refers to it, e.g. lmstudio:publisher/model
    path: Path
    architecture: str = "?"
    n_embd: int = 0
    n_layer: int = 0              # drafters: the target layer count they were made for (or their deepest tap)
    n_vocab: int = 0
    target_arch: str | None = None            # drafters: the target architecture, when recorded
    is_drafter: bool = False
    drafters: list[Path] = field(default_factory=list)


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _data_dir() -> Path:
    if sys.platform == "darwin":
        return _home() / "Library" / "Application Support"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or _home() / "AppData" / "Roaming")
    return Path(os.environ.get("XDG_DATA_HOME") or _home() / ".local" / "share")


def _config_dir() -> Path:
    if sys.platform in ("darwin", "win32"):
        return _data_dir()
    return Path(os.environ.get("XDG_CONFIG_HOME") or _home() / ".config")


def lmstudio_roots() -> list[Path]:
    home = _home() / ".lmstudio"
    pointer = _home() / ".lmstudio-home-pointer"
    if pointer.is_file():
        home = Path(pointer.read_text(encoding="utf-8").strip() or home)
    roots = [home / "models"]
    for settings in (home / "settings.json", _config_dir() / "LM Studio" / "settings.json"):
        folder = _json(settings).get("downloadsFolder")
        if isinstance(folder, str) and folder:
            roots.append(Path(folder))
    roots.append(_home() / ".cache" / "lm-studio" / "models")
    return _unique(roots)


def jan_data_folders() -> list[Path]:
    if os.environ.get("JAN_DATA_FOLDER"):
        return [Path(os.environ["JAN_DATA_FOLDER"])]
    data_dir = Path(os.environ.get("JAN_DATA_ROOT") or _data_dir())
    folders = []
    for settings in (data_dir / "jan.ai.app" / "settings.json", _config_dir() / "Jan" / "settings.json"):
        folder = _json(settings).get("data_folder")
        if isinstance(folder, str) and folder:
            folders.append(Path(folder))
    folders.append(data_dir / "Jan" / "data")
    return _unique(folders)


def hf_roots() -> list[Path]:
    if os.environ.get("HF_HUB_CACHE"):
        return [Path(os.environ["HF_HUB_CACHE"])]
    if os.environ.get("HF_HOME"):
        return [Path(os.environ["HF_HOME"]) / "hub"]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or _home() / ".cache")
    return [cache / "huggingface" / "hub"]


def list_files() -> list[Found]:
    """Every GGUF in the known folders, named, without reading headers."""
    out: list[Found] = []
    for root in lmstudio_roots():
        for folder in sorted(p for p in root.glob("*/*") if p.is_dir()) if root.is_dir() else []:
            files = _ggufs(folder)
            for p in files:
                name = f"lmstudio:{folder.parent.name}/{folder.name}"
                out.append(Found("lmstudio", name if len(files) == 1 else f"{name}/{p.relative_to(folder)}", p))
    for data in jan_data_folders():
        models = data / "llamacpp" / "models"
        for yml in sorted(models.rglob("model.yml")) if models.is_dir() else []:
            model_id = yml.parent.relative_to(models).as_posix()
            for p in _jan_model_files(yml, data):
                out.append(Found("jan", f"jan:{model_id}", p))
    for root in hf_roots():
        for snap in sorted(root.glob("models--*/snapshots/*")) if root.is_dir() else []:
            repo = snap.parent.parent.name.removeprefix("models--").replace("--", "/")
            for p in _ggufs(snap):
                out.append(Found("huggingface", f"hf:{repo}/{p.relative_to(snap).as_posix()}", p))
    from ..assets import ASSETS  # noqa: PLC0415
    out += [Found("shipped", f"shipped:{p.name}", p) for p in sorted(ASSETS.glob("*.gguf"))]
    seen: set[Path] = set()
    unique = []
    for f in out:                                # HF snapshots share blobs; apps may link the same file
        key = f.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def scan() -> list[Found]:
    """list_files() with GGUF headers read and, for each target, the drafters that fit it."""
    found = [read_header(f) for f in list_files()]
    by_folder: dict[str, list[Found]] = {}
    for f in found:
        if f.source == "lmstudio" and not f.is_drafter:
            by_folder.setdefault("/".join(f.name.split("/")[:2]), []).append(f)
    for short, targets in by_folder.items():
        if len(targets) == 1:                    # the only model in its folder: lmstudio:<publisher>/<model>
            targets[0].name = short
    drafters = [f for f in found if f.is_drafter]
    for f in found:
        if not f.is_drafter and f.architecture != "unreadable":
            f.drafters = [d.path for d in drafters if fits(d, f)]
    return found


def fits(drafter: Found, target: Found) -> bool:
    """A drafter reads the target's hidden states and borrows its embeddings and head: same width,
    taps within (or a recorded layer count equal to) the target's layers, same vocabulary."""
    return (drafter.n_embd == target.n_embd and 0 < drafter.n_layer <= target.n_layer
            and (not drafter.n_vocab or not target.n_vocab or drafter.n_vocab == target.n_vocab)
            and (drafter.target_arch is None or drafter.target_arch == target.architecture))


def read_header(found: Found) -> Found:
    from ..gguf_check import FOREIGN_DRAFTER_ARCHS, check_loadable, parse_header  # noqa: PLC0415
    try:
        h = parse_header(found.path)
        if h.arch not in FOREIGN_DRAFTER_ARCHS:     # (those are read by convert, never by llama.cpp)
            check_loadable(h)              # what llama.cpp would refuse or abort on is "unreadable" here
        value = h.value
        arch = h.arch
        found.architecture = arch
        found.n_embd = int(value(f"{arch}.embedding_length", 0))
        found.n_vocab = h.n_vocab() or 0
        found.is_drafter = arch in DRAFTER_ARCHS
        if found.is_drafter:
            recorded = value("dflash_gguf.target.n_layer")
            taps = value(f"{arch}.target_layers") or []
            found.n_layer = int(recorded) if recorded else max((int(t) for t in taps), default=0)
            found.target_arch = value("dflash_gguf.target.architecture")
        else:
            found.n_layer = int(value(f"{arch}.block_count", 0))
    except Exception:  # a damaged or foreign file must not stop the listing
        found.architecture = "unreadable"
    return found


def resolve_model(spec: str, *, drafter: bool = False) -> Path:
    """A path, or a name from `dflash-gguf models`: lmstudio:<publisher>/<model>[/<file>], jan:<id>,
    hf:<org>/<repo>/<file>, shipped:<file>."""
    if Path(spec).expanduser().exists():
        return Path(spec).expanduser()
    if not re.match(r"^(lmstudio|jan|hf|shipped):", spec):
        raise UserError(f"{spec}: no such file (or name like lmstudio:<publisher>/<model>; "
                        "see `dflash-gguf models`)")
    candidates = [f for f in list_files() if f.name == spec or f.name.startswith(spec.rstrip("/") + "/")]
    kind = [f for f in map(read_header, candidates) if f.is_drafter == drafter]
    what = "drafter" if drafter else "model"
    if not kind:
        raise UserError(f"{spec}: no such {what} found in the LM Studio / Jan / Hugging Face folders "
                        "(see `dflash-gguf models`)")
    if len(kind) > 1:
        names = ", ".join(f.name for f in kind)
        raise UserError(f"{spec}: several files match ({names}); give one of these names")
    return kind[0].path


def drafters_for(target: Path) -> list[Path]:
    """Drafters in the known folders that fit `target` (which may live anywhere)."""
    t = read_header(Found("file", str(target), target))
    return [d.path for d in map(read_header, list_files()) if d.is_drafter and fits(d, t)]


def _ggufs(folder: Path) -> list[Path]:
    files = []
    for p in sorted(folder.rglob("*.gguf")):
        shard = _SHARD.search(p.name)
        if p.name.lower().startswith("mmproj") or (shard and shard.group(1) != "00001"):
            continue                              # vision projectors and later shards are not models
        files.append(p)
    return files


def _jan_model_files(yml: Path, data: Path) -> list[Path]:
    """The GGUF a Jan model.yml names (`model_path`, absolute or relative to the data folder), else the
    GGUFs beside it."""
    m = re.search(r"^model_path:\s*['\"]?(.+?)['\"]?\s*$", yml.read_text(encoding="utf-8", errors="replace"),
                  re.M)
    if m:
        p = Path(m.group(1))
        p = p if p.is_absolute() else data / p
        if p.is_file():
            return [p]
    return _ggufs(yml.parent)


def _unique(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p not in out:
            out.append(p)
    return out
