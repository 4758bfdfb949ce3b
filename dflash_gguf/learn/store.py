"""The learn store: a folder of shards, one per finished request (its rendered prompt and answer token ids).

A shard is written to a hidden temporary name, flushed to disk and renamed into place, so a process killed
mid-write leaves at most a temporary file that readers skip: never a half-written shard. Every shard names
the target (file and sha256), the chat template (sha256 of its text; none for raw completions) and the drafter
it ran with, so `train --adapt` can refuse a store recorded with another target. The folder is capped in
bytes: once a new shard pushes it past the cap, the oldest shards go first (names start with the time they
were written, so name order is age order).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UserError

FORMAT = "dflash-gguf-learn/1"
SUFFIX = ".json"
STALE_TMP_S = 3600           # a temporary file this old belongs to a writer that was killed


@dataclass(frozen=True)
class Tags:
    """What a recorded answer depends on besides its prompt."""
    target: str                          # file name
    target_sha256: str
    drafter: str | None = None           # file name; None: served without speculation
    drafter_sha256: str | None = None
    template_sha256: str | None = None   # the chat template's text; None: a raw completion


@dataclass(frozen=True)
class Conversation:
    """One recorded request: `prompt` as the target read it (template applied), `answer` as it wrote it."""
    prompt: list[int]
    answer: list[int]
    tags: Tags
    shard: Path


@functools.lru_cache(maxsize=16)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    from ..paths import sha256_file  # noqa: PLC0415
    return sha256_file(path)


def file_tag(path: Path | None) -> tuple[str | None, str | None]:
    """(name, sha256) of a model file, hashed once per version of the file."""
    if path is None:
        return None, None
    st = Path(path).stat()
    return Path(path).name, _file_sha256(Path(path), st.st_size, st.st_mtime_ns)


def text_sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


class LearnStore:
    def __init__(self, root: Path, max_bytes: int | None = None):
        """`root`: the store's folder (made on the first record); `max_bytes`: its cap (None: no cap)."""
        self.root = Path(root)
        self.max_bytes = max_bytes
        if self.root.exists() and not self.root.is_dir():
            raise UserError(f"--learn {self.root}: not a folder; give a folder for the recorded requests")

    def record(self, tags: Tags, prompt: list[int], answer: list[int]) -> Path:
        """Write one finished request as a new shard (atomically), then trim the store to its cap."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}{SUFFIX}"
        body = json.dumps({"format": FORMAT, "tags": asdict(tags), "prompt": [int(t) for t in prompt],
                           "answer": [int(t) for t in answer]}, separators=(",", ":")).encode()
        tmp = self.root / f".{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / name)
        self.trim()
        return self.root / name

    def shards(self) -> list[Path]:
        """The complete shards, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.shards())

    def trim(self) -> None:
        """Oldest shards out until the store fits its cap (the newest always stays); stale temporaries out."""
        now = time.time()
        for p in self.root.glob(".*.tmp"):
            try:
                if now - p.stat().st_mtime > STALE_TMP_S:
                    p.unlink()
            except FileNotFoundError:        # another writer's, just renamed
                pass
        if self.max_bytes is None:
            return
        shards = self.shards()
        sizes = [p.stat().st_size for p in shards]
        total = sum(sizes)
        for p, n in zip(shards[:-1], sizes[:-1]):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= n

    def read(self) -> list[Conversation]:
        """Every recorded request, oldest first; a shard that is not one is a one-line error naming it."""
        if not self.root.is_dir():
            raise UserError(f"--adapt {self.root}: no such folder; record into it first (serve --learn {self.root})")
        return [_parse(p) for p in self.shards()]


def _parse(path: Path) -> Conversation:
    try:
        raw = json.loads(path.read_bytes())
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, not {FORMAT}")
        tags = Tags(**raw["tags"])
        prompt, answer = [int(t) for t in raw["prompt"]], [int(t) for t in raw["answer"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{path}: not a learn shard ({e}); delete that file and adapt again") from None
    return Conversation(prompt, answer, tags, path)


class Recorder:
    """What `serve --learn` and `run --learn` call after each finished request."""

    def __init__(self, store: LearnStore, target: Path):
        self.store = store
        self.target = file_tag(target)            # hashed once, before the first request

    def record(self, prompt: list[int], answer: list[int], *, template: str | None, drafter: Path | None) -> Path:
        """`template`: the chat template text the prompt was rendered with (None: a raw completion); `drafter`:
        the drafter file it ran with (None: no drafter)."""
        return self.store.record(Tags(*self.target, *file_tag(drafter), text_sha256(template)), prompt, answer)

    def recent_answers(self, max_tokens: int) -> list[list[int]]:
        """The newest recorded answers of this target, oldest first, up to about max_tokens tokens in all (what
        the lookup's corpus holds); shards that are not ones, or of another target, are passed over."""
        answers: list[list[int]] = []
        total = 0
        for path in reversed(self.store.shards()):
            if total >= max_tokens:
                break
            try:
                c = _parse(path)
            except UserError:
                continue
            if c.tags.target_sha256 == self.target[1] and c.answer:
                answers.append(c.answer)
                total += len(c.answer)
        return answers[::-1]

    def announce(self) -> str:
        cap = "no size cap" if self.store.max_bytes is None else \
            f"at most {self.store.max_bytes / 2**20:g} MB, oldest out first"
        return (f"learning: each finished request's prompt and answer token ids are recorded in {self.store.root} "
                f"({cap}; tagged with target sha256 {self.target[1][:12]}…, the template and the drafter); "
                f"nothing else is stored. The answers recorded so far draft by lookup where they repeat; adapt the "
                f"drafter on them: dflash-gguf train --adapt {self.store.root}")


def recorder_for(folder: Path | None, max_mb: float, target: Path) -> Recorder | None:
    """The recorder `--learn FOLDER --learn-max-mb N` asks for (None without --learn: nothing is written)."""
    if folder is None:
        return None
    if max_mb <= 0:
        raise UserError(f"--learn-max-mb {max_mb}: must be > 0 (MB the store may hold)")
    return Recorder(LearnStore(folder, int(max_mb * 2**20)), target)
