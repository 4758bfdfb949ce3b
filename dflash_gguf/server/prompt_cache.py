"""Conversations that don't re-read themselves: the server's prompt cache (llama-server's `cache_prompt`).

The engine holds one sequence — the last conversation, in the target's KV cache and the drafter's — and
the next request reuses its longest common token prefix (engine/prefix.py: both are cut back to it, only
the rest is prefilled). Other conversations wait in RAM as snapshots (llama_state_seq_get_data of both
contexts), least recently used first out, within `--cache-ram` MiB; the one a request continues best is
copied back in. A slot (llama-server's `/slots/0?action=save|restore|erase`) is the held sequence written
to / read from a file under `--slot-save-path`, with a header that names the model files and context
settings, so a file is never restored into an engine that would compute it differently.

Why snapshots and not one context with several sequences: the engine decodes one sequence at a time (the
worker runs jobs one by one), so several sequences would buy no batching and would cost the context's
size for every one of them (n_ctx per sequence, reserved up front), plus sequence ids through the loop,
the taps and the drafter. A snapshot costs a copy when a conversation is switched: measured on SmolLM2-135M
Q4_1 + the shipped drafter, 2-core EPYC under load (lab/bench_prompt_cache.py), a 1,511-token chat came back
from RAM with a first token in 2.9 s against 1.5 s when it was still held and 29 s cold; its state is ~25 KB a
token (38 MB for 1,542 tokens).

Reuse is exact on the CPU (engine/prefix.py) and never crosses models: one engine per server, and slot
files carry the engine's identity. A generation cut short leaves the held sequence consistent (the loop
stops between steps; an exception makes the engine forget it).
"""

from __future__ import annotations

import collections
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..engine.prefix import SequenceSnapshot, common_prefix
from ..errors import UserError

MAGIC = b"DFLASHSLOT2\n"
# a conversation is parked in RAM before a request replaces most of it (llama-server's --cache-ram-similarity)
PARK_BELOW = 0.5


@dataclass
class CacheSettings:
    enabled: bool = True                   # --no-cache-prompt: every request starts cold
    ram_bytes: int | None = 2048 << 20     # --cache-ram MiB; None: no limit, 0: only the held conversation
    slot_dir: Path | None = None           # --slot-save-path: where /slots save and restore files live


class SlotFileError(UserError):
    """A slot file that is missing, malformed, or made by another model or settings (or no slot folder)."""

    TYPES = {404: "not_found_error", 501: "not_supported_error"}

    def __init__(self, message: str, http_status: int = 400):
        super().__init__(message)
        self.http_status = http_status
        self.error_type = self.TYPES.get(http_status, UserError.error_type)


class PromptCache:
    """Lives in the engine thread: every method touches the engine's contexts."""

    def __init__(self, engine, settings: CacheSettings, identity: dict):
        self.engine, self.settings, self.identity = engine, settings, identity
        self.saved: "collections.OrderedDict[int, SequenceSnapshot]" = collections.OrderedDict()   # LRU first
        self._next_id = 0
        self.n_parked = self.n_restored = self.n_evicted = 0

    @property
    def ram_used(self) -> int:
        return sum(s.nbytes for s in self.saved.values())

    def prepare(self, prompt: Sequence[int], use_cache: bool) -> int:
        """Put the best cached prefix of `prompt` in the engine; returns its length (`timings.cache_n`)."""
        held = self.engine.held_tokens
        lcp = common_prefix(held, prompt)
        if not (self.settings.enabled and use_cache):
            self._park_if_replaced(held, lcp)
            return 0
        best_id, best = self._best_saved(prompt)
        chosen = self.saved.pop(best_id) if best > lcp else None    # before parking can evict it
        self._park_if_replaced(held, lcp)
        if chosen is not None:
            self.engine.restore(chosen)
            self.n_restored += 1
        return self.engine.keep_prefix(prompt)

    def _best_saved(self, prompt: Sequence[int]) -> tuple[int | None, int]:
        best_id, best = None, 0
        for sid, snap in self.saved.items():
            n = common_prefix(snap.tokens, prompt)
            if n > best:
                best_id, best = sid, n
        return best_id, best

    def _park_if_replaced(self, held: list[int], lcp: int) -> None:
        """Copy the held conversation to RAM when the coming request keeps less than half of it."""
        if not held or lcp >= PARK_BELOW * len(held) or self.settings.ram_bytes == 0:
            return
        snap = self.engine.snapshot()
        limit = self.settings.ram_bytes
        if limit is not None and snap.nbytes > limit:
            return
        for sid in [sid for sid, s in self.saved.items() if common_prefix(s.tokens, snap.tokens) == len(s.tokens)]:
            del self.saved[sid]                     # a shorter copy of the same conversation
        self.saved[self._next_id] = snap
        self._next_id += 1
        self.n_parked += 1
        while limit is not None and self.ram_used > limit:
            self.saved.popitem(last=False)
            self.n_evicted += 1

    def settle(self, should_stop: Callable[[], bool] = lambda: False) -> int:
        """After a generation: make its positions reusable by the next turn, until `should_stop()` says a request
        waits (Engine.widen)."""
        return self.engine.widen(should_stop) if self.settings.enabled else 0

    # -- slots on disk (llama-server's /slots/{id}?action=...) --------------------------------------
    def slot_path(self, filename: str) -> Path:
        if self.settings.slot_dir is None:
            raise SlotFileError("slot save/restore needs a folder: start the server with --slot-save-path DIR",
                                http_status=501)
        if not filename or "/" in filename or "\\" in filename or filename.startswith(".") or "\0" in filename:
            raise SlotFileError(f"invalid slot file name {filename!r}: a plain file name, no folders")
        return self.settings.slot_dir / filename

    def save_slot(self, filename: str) -> tuple[int, int]:
        """Write the held conversation; returns (tokens saved, bytes written)."""
        path = self.slot_path(filename)
        snap = self.engine.snapshot()
        header = json.dumps({**self.identity, "n_tokens": len(snap.tokens), "target_bytes": len(snap.target),
                             "drafter_bytes": len(snap.drafter) if snap.drafter is not None else -1}).encode()
        blobs = [MAGIC, struct.pack("<I", len(header)), header, struct.pack(f"<{len(snap.tokens)}i", *snap.tokens),
                 bytes(snap.wide), snap.target, snap.drafter or b""]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(b"".join(blobs))
        tmp.replace(path)
        return len(snap.tokens), sum(len(b) for b in blobs)

    def restore_slot(self, filename: str) -> tuple[int, int]:
        """Read a slot file into the engine; returns (tokens restored, bytes read)."""
        path = self.slot_path(filename)
        if not path.is_file():
            raise SlotFileError(f"slot file {filename!r} not found in --slot-save-path", http_status=404)
        data = path.read_bytes()
        snap = self._parse(data, filename)
        self.engine.restore(snap)
        return len(snap.tokens), len(data)

    def _parse(self, data: bytes, filename: str) -> SequenceSnapshot:
        bad = SlotFileError(f"slot file {filename!r} is not a dflash-gguf slot file (or is truncated)")
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
            raise bad
        at = len(MAGIC) + 4
        (n_header,) = struct.unpack_from("<I", data, len(MAGIC))
        try:
            header = json.loads(data[at:at + n_header])
        except ValueError:
            raise bad from None
        at += n_header
        mismatch = {k: (header.get(k), v) for k, v in self.identity.items() if header.get(k) != v}
        if mismatch:
            k, (theirs, ours) = next(iter(mismatch.items()))
            raise SlotFileError(f"slot file {filename!r} was saved with another {k} ({theirs!r}, this server: "
                                f"{ours!r}): its cache would not match what this server computes")
        n, nt, nd = header["n_tokens"], header["target_bytes"], header["drafter_bytes"]
        if len(data) != at + 5 * n + nt + max(nd, 0):
            raise bad
        tokens = list(struct.unpack_from(f"<{n}i", data, at))
        wide = [bool(b) for b in data[at + 4 * n:at + 5 * n]]
        at += 5 * n
        return SequenceSnapshot(tokens, wide, data[at:at + nt], data[at + nt:] if nd >= 0 else None)

    def erase_slot(self) -> int:
        n = len(self.engine.held_tokens)
        self.engine.forget()
        return n
