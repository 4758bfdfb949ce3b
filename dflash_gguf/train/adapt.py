"""`train --adapt`: continue a drafter on the requests a server recorded (learn/store.py), within a time box.

One person's traffic is narrow (one codebase, one persona, one system prompt), so a drafter tuned on it gains
most where that person spends their tokens. The recorded conversations are read back through the target to get
its features; a replay of the drafter's original training distribution (the shipped prompt set's part it was
trained on, answered by the target and kept in the user cache) is mixed in so it does not forget the rest.
A tenth of the recorded conversations is held back: τ before and after, on them and on a fixed general set
(held-back prompts of the shipped set), is measured through llama.cpp as `bench --tau` measures it.

Training on a few hundred conversations can make the drafter worse on requests it has not seen while its loss
falls, and worse on what is not the user's traffic while the held-back τ still rises (docs/learning.md), so both
are measured at checkpoints during training: the drafter written is the checkpoint best on the held-back requests
among those that keep the general set's τ within --general-drop of the start's, and none at all (unless --force)
if no such checkpoint beats the drafter it started from.

When the last checkpoint lost more than that, blends of it with the drafter adapting started from are measured too,
bisecting for the largest share of the adapted weights that holds (weight-space interpolation, "WiSE-FT", Wortsman
et al. 2022): on this drafter a blend keeps most of the held-back gain and gives back most of what was lost
elsewhere (docs/learning.md). --max-minutes bounds all of it, the measurements included.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import RunFailure, UserError
from ..learn.store import Conversation, LearnStore
from ..target_file import TargetFile
from .options import ADAPT_LR, BLENDS

# what a checkpoint's measurement holds for the guard (a resumed run measured without one of them measures again)
GUARD_KEYS = ("tau_general", "tau_everyday", "tau_general_se", "tau_everyday_se", "tau_general_by_category")
RECORDED_INDEX = 10_000_000     # dataset prompt_index of recorded conversation i (replay ones count from 0)
# what the measurements to come are priced at, times the one timed before training: one run's measurements took 6-11 s
# where the one timed took ~7 (other load on the machine), and its 30-minute box ran 30.2 minutes at 1.0
RESERVE_MARGIN = 1.5
TOP_K = 8                       # the target's most likely tokens kept per position with --tv (the shipped recipe's)


@dataclass
class AdaptSettings:
    minutes: float = 20.0           # the whole run: the first measurement, data preparation, training and the
                                    # measurements of its checkpoints and blends
    replay: float = 1.0             # replayed sequences of the original distribution per recorded one
    held_back: float = 0.1          # share of the recorded conversations kept out of training, for τ
    lr: float = ADAPT_LR            # peak; warm-up and cosine run over the training part of the time box
    eval_per_category: int = 10     # prompts per category of the general set (and per kind of the everyday set)
    eval_held_back: int = 20        # most held-back conversations measured
    eval_tokens: int = 128
    checkpoints: int = 6            # τ measured this many times, evenly over the training time
    general_drop: float = 0.05      # a checkpoint is kept only if its general-set τ fell by at most this much
    rows: int | None = None         # labelled rows at most: training and its schedule end at them or at the time
                                    # box, whichever comes first (None: the time box alone)
    seed: int = 0
    threads: int = 0
    prompts: tuple[Path, ...] = ()  # the drafter's training prompts (replay, general set); (): the shipped set
    replay_dir: Path | None = None  # where replayed data is kept; None: the user cache
    tv: float = 0.0                 # share of the loss that is the total variation to the target's top-k, which the
                                    # replayed and recorded data then keep (0: hard labels only)
    blends: tuple[float, ...] = BLENDS  # shares of the last checkpoint in the blends measured when it lost the guard

    @property
    def top_k(self) -> int:
        """TOP_K with --tv, 0 (hard labels: the data keep no top-k) without."""
        return TOP_K if self.tv > 0 else 0


def recorded(store_dir: Path, target: TargetFile) -> list[Conversation]:
    """The store's conversations, distinct; a store (or any shard of it) from another target is refused."""
    convs = LearnStore(store_dir).read()
    if not convs:
        raise UserError(f"--adapt {store_dir}: no recorded requests yet; serve with --learn {store_dir} first")
    other = [c for c in convs if c.tags.target_sha256 != target.sha256]
    if other:
        c = other[0]
        raise UserError(f"--adapt {store_dir}: {len(other)} of its {len(convs)} requests were recorded with "
                        f"{c.tags.target} (sha256 {c.tags.target_sha256[:12]}…), not -m {target.path.name} "
                        f"(sha256 {target.sha256[:12]}…); adapt with the target they were recorded with")
    seen, out = set(), []
    for c in convs:
        key = (tuple(c.prompt), tuple(c.answer))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def split_held_back(convs: list[Conversation], share: float) -> tuple[list[Conversation], list[Conversation]]:
    """(train, held back): the held-back ones are those whose prompt hashes lowest, so the split of a store does
    not depend on the order it was recorded in; at least one of each once there are two."""
    if len(convs) < 2:
        raise UserError(f"{len(convs)} recorded request(s): adapting needs at least 2 (one is held back to measure)")
    order = sorted(convs, key=lambda c: hashlib.sha256(np.asarray(c.prompt + [-1] + c.answer, np.int64)).digest())
    n_held = min(len(convs) - 1, max(1, round(share * len(convs))))
    return order[n_held:], order[:n_held]


def prompt_sets(files: tuple[Path, ...], per_category: int, seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    """(replay pool in a fixed shuffled order, general set, everyday set) from the drafter's training prompts: by
    default the shipped drafter's, the default set (the part it was trained on is the pool, the held-back part gives
    the general set) and the everyday mix it was continued on (its own rows, in the pool but for the everyday set);
    from other files (--prompts) the general set is taken from their end and the pool is the rest.
    The pool holds no prompt of the general set's families (corpus.prompts.general_set): the guard then measures
    what the replay does not protect, as the user's other traffic is.
    The everyday set (per_category everyday requests and as many story problems, corpus.prompts.everyday_set) is the
    same whatever the training prompts: what chat apps are asked, where adapting to one persona costs most."""
    from ..corpus.prompts import (  # noqa: PLC0415
        DEFAULT_PROMPTS, HELD_BACK_FROM, everyday_rows, everyday_set, family, general_set, load)
    everyday = everyday_set(per_category) if per_category else []
    rows = [r for f in files for r in load(f)] if files else load(DEFAULT_PROMPTS)
    if not files:
        guard = {r["id"] for r in everyday}
        general = general_set(rows[HELD_BACK_FROM:], per_category)
        pool = rows[:HELD_BACK_FROM] + [r for r in everyday_rows() if r["id"] not in guard]
    else:
        general = general_set(rows, per_category)
        pool = rows
    guarded = {family(r) for r in general}          # the general set's own prompts are of these families too
    pool = [r for r in pool if family(r) not in guarded]
    if not pool:
        raise UserError(f"--prompts {', '.join(map(str, files))}: no prompts left to replay once the general set "
                        f"({per_category} per category) and its families are taken out; give more prompts")
    return [pool[i] for i in np.random.default_rng(seed).permutation(len(pool))], general, everyday


def replay_data(target: TargetFile, taps: list[int], pool: list[dict], n: int, s: AdaptSettings, deadline: float):
    """A FeatureDataset of at least `n` replayed sequences (fewer if the deadline comes first), harvested once
    per target and taps into the user cache and grown by later runs that want more."""
    from ..paths import cache_root  # noqa: PLC0415
    from .dataset import FeatureDataset  # noqa: PLC0415
    from .harvest import HarvestSettings, harvest  # noqa: PLC0415
    from .pipeline import prompts_sha256  # noqa: PLC0415
    from .preflight import dataset_feature_dtype, run_checks  # noqa: PLC0415
    folder = (s.replay_dir or cache_root() / "adapt-replay") / (f"{target.sha256[:16]}-{prompts_sha256(pool)[:12]}"
                                                                f"-taps{'-'.join(map(str, taps))}-s{s.seed}"
                                                                + (f"-k{s.top_k}" if s.top_k else ""))
    have = FeatureDataset(folder).refresh() if (folder / "index.jsonl").exists() else 0
    if have < n:
        checked = run_checks(target, pool[:64], taps, n_layers=1, block_size=2, draft_vocab=None, chat_template=None,
                             data_dir=folder, max_tokens=None, top_k_probs=s.top_k, n_threads=s.threads)
        settings = HarvestSettings(taps=taps, seed=s.seed, n_threads=s.threads, top_k_probs=s.top_k,
                                   max_new={"code": 128, "math": 160, "chat": 160},
                                   feature_dtype=dataset_feature_dtype(folder, checked.feature_dtype))
        print(f"replay: the target answers {n - have} prompts of the drafter's original distribution "
              f"(kept in {folder} for later runs)", file=sys.stderr)
        harvest(target, pool, folder, settings, max_seconds=max(deadline - time.time(), 1.0),
                meta_extra={"target_sha256": target.sha256, "prompts_sha256": prompts_sha256(pool)},
                prompt_range=(0, _range_for(folder, n)))
    return FeatureDataset(folder)


def _range_for(folder: Path, n: int) -> int:
    """Prompt indices to cover so that `n` sequences exist (a few prompts are skipped as too long)."""
    done = 0
    if (folder / "index.jsonl").exists():
        done = sum(1 for line in (folder / "index.jsonl").read_text().splitlines() if line.strip())
    return int((n - done) * 1.1) + done + 8


def build_dataset(folder: Path, target: TargetFile, replay, n_replay: int, train: list[Conversation],
                  threads: int):
    """The training folder: `n_replay` sequences copied from the replay data, then the recorded conversations
    with their features recomputed through the target (resumable: sequences already there are kept)."""
    from .dataset import FeatureDataset, spans_of  # noqa: PLC0415
    from .harvest import DatasetWriter  # noqa: PLC0415
    from .refeature import write_with_features  # noqa: PLC0415
    k = replay.top_k
    ident = hashlib.sha256(json.dumps([replay.meta.get("prompts_sha256"), n_replay, [c.shard.name for c in train]]
                                      + ([k] if k else [])).encode()).hexdigest()
    meta = {"target": target.path.name, "target_sha256": target.sha256, "prompts_sha256": ident,
            "seed": replay.meta["seed"], "taps": replay.taps, "n_embd": replay.meta["n_embd"],
            "store_features": True, "top_k_probs": k, "feature_dtype": replay.feature_dtype,
            "features": "replay: harvested; recorded: recomputed by a batched prefill"}
    old = folder / "meta.json"
    if old.exists() and json.loads(old.read_text()).get("prompts_sha256") != ident:
        shutil.rmtree(folder)                # another store or replay share: start afresh, checkpoint included
        shutil.rmtree(folder.parent / "checkpoint", ignore_errors=True)
        (folder.parent / "adapt-plan.json").unlink(missing_ok=True)
        (folder.parent / "checkpoint-taus.json").unlink(missing_ok=True)
    writer = DatasetWriter(folder, meta)
    for r in replay.index[:n_replay]:
        if r["prompt_index"] in writer.done:
            continue
        off, n = r["offset"], r["length"]
        top = {"topk_ids": np.asarray(replay.topk_ids[off:off + n]),
               "topk_p": np.asarray(replay.topk_p[off:off + n], np.float32)} if k else {}
        writer.add(np.asarray(replay.tokens[off:off + n]).tolist(), spans_of(r), {**r, "source": "replay"},
                   prompt_index=r["prompt_index"], sampled=bool(r.get("sampled")), feats=replay.features(off, off + n),
                   **top)
    items = [(RECORDED_INDEX + i, c.prompt + c.answer, [[len(c.prompt), len(c.prompt) + len(c.answer)]],
              {"category": "recorded", "source": f"learn:{c.shard.name}"}) for i, c in enumerate(train)]
    write_with_features(writer, target, items, n_threads=threads)
    return FeatureDataset(folder)


class Yardstick:
    """τ (greedy, full blocks, as `bench --tau`) on the held-back requests, the general set and the everyday set,
    every drafter walked along the same continuations of the target, generated by the first measurement."""

    def __init__(self, target: Path, held: list[Conversation], general: list[dict], everyday: list[dict],
                 s: AdaptSettings):
        self.target, self.s = target, s
        self.rows = [{"category": "held_back", "id": c.shard.name, "tokens": c.prompt} for c in held[:s.eval_held_back]]
        self.n_held_back = len(self.rows)
        self.rows += [{**r, "category": f"general:{r.get('category', 'chat')}"} for r in general]
        self.rows += [{**r, "category": f"everyday:{r.get('category', 'chat')}"} for r in everyday]
        self.conts = None

    def _renderable(self, model) -> list[dict]:
        """The rows, without the everyday set's chat requests when the target has no chat template to render them."""
        from ..textgen.chat import ChatTemplateError, model_template  # noqa: PLC0415
        try:
            model_template(model, None)
            return self.rows
        except ChatTemplateError:
            print(f"note: {self.target.name} has no chat template: the everyday set is not measured", file=sys.stderr)
            return [r for r in self.rows if not r["category"].startswith("everyday:")]

    def tau(self, drafter: Path) -> dict:
        """{"held_back", "general", "everyday" (each nan without its set), "general_by_category",
        "everyday_by_category"}."""
        from ..bench.tau import NativeDraftProbe, continuations, walk_tau  # noqa: PLC0415
        probe = NativeDraftProbe(self.target, drafter, self.s.threads)
        try:
            if self.conts is None:
                self.rows = self._renderable(probe.target)
            self.conts = self.conts or continuations(probe, self.rows, self.s.eval_tokens)
            report = walk_tau(probe, self.conts)
        finally:
            probe.close()

        def pooled(keep) -> float:
            got = [p for p in report.per_prompt if keep(p["category"])]
            calls = sum(p["calls"] for p in got)
            return round(sum(p["tokens"] - 1 for p in got) / calls, 3) if calls else float("nan")
        def by_category(part: str) -> dict:
            return {c.removeprefix(part): round(v, 3) for c, v in report.by_category.items() if c.startswith(part)}
        def each(part: str) -> list[float]:
            return [round((p["tokens"] - 1) / p["calls"], 4) for p in report.per_prompt
                    if p["category"].startswith(part) and p["calls"]]
        return {"held_back": pooled(lambda c: c == "held_back"), "general": pooled(lambda c: c.startswith("general:")),
                "everyday": pooled(lambda c: c.startswith("everyday:")),
                "general_by_category": by_category("general:"), "everyday_by_category": by_category("everyday:"),
                "general_per_prompt": each("general:"), "everyday_per_prompt": each("everyday:")}


def paired_error(start: list[float], now: list[float]) -> float | None:
    """The standard error of the mean per-prompt change in τ from `start` to `now` (the same prompts, in order,
    along the same continuations); None with fewer than two prompts."""
    if len(start) != len(now) or len(start) < 2:
        return None
    change = np.asarray(now, np.float64) - np.asarray(start, np.float64)
    return round(float(change.std(ddof=1) / math.sqrt(len(change))), 4)


@dataclass
class CheckpointChoice:
    """Early stopping on held-back τ that holds the general and the everyday set. Every checkpoint is measured on all
    three; the one kept (`best`, as `best_file`) is the best on the held-back requests among those whose τ fell by at
    most `general_drop` below the start's on each of the two sets (a set not measured holds), or, when none did, the
    best on the held-back requests. It is written only if it holds both and beats the drafter adapting started from on
    the held-back requests (`start`)."""
    start: float                                            # τ of the starting drafter on the held-back requests
    start_general: float | None = None                      # ... on the general set (None: no general set)
    general_drop: float = 0.05
    measured: list[dict] = field(default_factory=list)      # per checkpoint: step, rows, minutes, τ held back/general
    best: dict | None = None
    start_everyday: float | None = None                     # ... on the everyday set (None: not measured)
    start_general_by_category: dict[str, float] | None = None   # ... on each category of the general set

    @property
    def guard_sets(self) -> tuple[tuple[str, str, float | None], ...]:
        """(name, the point's key, τ of the start) of the two sets a checkpoint must hold."""
        return ("general", "tau_general", self.start_general), ("everyday", "tau_everyday", self.start_everyday)

    def holds(self, point: dict) -> bool:
        """The checkpoint's τ fell by at most `general_drop` on the general and on the everyday set, one standard
        error of the fall included (`_within`), and on each category of the general set (`categories_lost`)."""
        return all(self._within(point, key, start) for _, key, start in self.guard_sets) and \
            not self.categories_lost(point)

    def categories_lost(self, point: dict) -> list[str]:
        """The general set's categories whose τ fell by more than `general_drop`, each judged alone: the category
        the user's traffic is in rises, and in the pooled τ it made up for falls of 0.06 in the others, which
        ../shared/prompts fell too (docs/learning.md). A category's ten prompts measure its fall to about ±0.04, so
        its fall is judged as measured; a category not measured is lost."""
        now = point.get("tau_general_by_category") or {}
        return [c for c, start in (self.start_general_by_category or {}).items()
                if c not in now or now[c] < start - self.general_drop - 1e-9]

    def _within(self, point: dict, key: str, start: float | None) -> bool:
        """τ on one set fell by at most `general_drop`, counted with its standard error (`<key>_se`, over the
        set's prompts): a set of 15-40 prompts measures a fall with an error of 0.02-0.04 τ, and the falls it let
        through ran 1.5-2.5x larger on ../shared/prompts (docs/learning.md), so the fall's one-sigma upper bound
        is what must stay within it (1e-9: τ is rounded to 3 decimals). A set not measured holds."""
        if start is None:
            return True
        if point.get(key) is None:
            return False
        return point[key] - (point.get(f"{key}_se") or 0.0) >= start - self.general_drop - 1e-9

    @property
    def improved(self) -> bool:
        return self.best is not None and self.holds(self.best) and self.best["tau_held_back"] > self.start

    def add(self, point: dict) -> bool:
        """Record a checkpoint's measurement; True when it is the one to keep so far."""
        self.measured.append(point)
        rank = lambda p: (self.holds(p), p["tau_held_back"])        # noqa: E731
        if self.best is None or rank(point) > rank(self.best):
            self.best = point
            return True
        return False

    def refusal(self, drafter: str, n_held: int) -> str:
        """Why nothing is written (when not `improved`): no checkpoint beat the start on the held-back requests, or
        the ones that did lost more than `general_drop` on the general set."""
        beat = [p for p in self.measured if p["tau_held_back"] > self.start]
        if not beat:
            best = f"best checkpoint {self.best['tau_held_back']:.2f}" if self.best else "no checkpoint measured"
            return f"no checkpoint beat {drafter} on the {n_held} held-back recorded requests (τ {self.start:.2f}, {best})"
        top = max(beat, key=lambda p: p["tau_held_back"])
        lost = [f"the {name} set ({start:.2f} → at most {max(p[key] for p in beat):.2f})"
                for name, key, start in self.guard_sets if any(not self._within(p, key, start) for p in beat)]
        lost += [f"the general set's {c} ({start:.2f} → at most {max(_category_tau(p, c) for p in beat):.2f})"
                 for c, start in (self.start_general_by_category or {}).items()
                 if any(c in self.categories_lost(p) for p in beat)]
        return (f"the {len(beat)} checkpoint(s) that beat {drafter} on the {n_held} held-back recorded requests "
                f"(τ {self.start:.2f}, best {top['tau_held_back']:.2f}) lost more than {self.general_drop:g} τ, "
                f"one standard error included, on {' or '.join(lost)}; --general-drop)")

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def resumed(cls, path: Path, fresh: "CheckpointChoice", resume: bool) -> "CheckpointChoice":
        """What a killed run had measured (with `resume`, the same start and rule), else `fresh`."""
        if resume and path.exists():
            kept = cls(**json.loads(path.read_text()))
            same = (kept.start, kept.start_general, kept.start_everyday, kept.general_drop,
                    kept.start_general_by_category) == (fresh.start, fresh.start_general, fresh.start_everyday,
                                                        fresh.general_drop, fresh.start_general_by_category)
            if same and all(k in p for p in kept.measured for k in GUARD_KEYS):
                return kept
        return fresh


def adapt(target: TargetFile, drafter: Path, out: Path, store_dir: Path, work: Path, s: AdaptSettings,
          *, force: bool = False, resume: bool = False, started: float | None = None) -> dict:
    """Continue `drafter` on the store's conversations and write the checkpoint CheckpointChoice keeps to `out` (a
    new validated GGUF); returns the record (τ before/after, per checkpoint, data, training). If no checkpoint
    beats `drafter` on the held-back requests while holding the general set (`s.general_drop`), `out` is not
    written (RunFailure, after the record) unless `force`.
    `work` keeps the data and checkpoints: with `resume`, a run killed on the way goes on where it stopped
    (measurement, data and training)."""
    from ..learn.store import file_tag  # noqa: PLC0415
    from .pipeline import export, init_record, read_drafter, training_record  # noqa: PLC0415
    t0 = started or time.time()         # the time box's start: the command's, when the caller knows it
    check_paths(drafter, out, force)
    train, held = split_held_back(recorded(store_dir, target), s.held_back)
    src = read_drafter(drafter, target)
    if src.draft_vocab is None and src.config.vocab_size and src.config.vocab_size != target.n_vocab:
        raise UserError(f"-md {drafter}: its vocabulary ({src.config.vocab_size}) is not the target's "
                        f"({target.n_vocab})")
    pool, general, everyday = prompt_sets(s.prompts, s.eval_per_category, s.seed)
    yardstick = Yardstick(target.path, held, general, everyday, s)
    print(f"adapting {drafter.name} on {len(train)} recorded requests (+{round(s.replay * len(train))} replayed), "
          f"{len(held)} held back ({yardstick.n_held_back} measured)", file=sys.stderr)
    key = json.dumps([file_tag(drafter)[1], [r.get("id") for r in yardstick.rows], s.eval_tokens, "per-prompt"])
    before = _measured_once(work / "tau-before.json", key, lambda: yardstick.tau(drafter))
    print(f"τ before: held back {before['held_back']}, general {before['general']}, everyday {before['everyday']}",
          file=sys.stderr)
    deadline = t0 + s.minutes * 60             # the time box: all of it, the measurements to come included
    data, n_replay = prepare_data(target, src.config, pool, train, work, s, deadline)
    trainer = continued_trainer(target, src, str(drafter), data, s)

    def reserve() -> float:             # what the checkpoints' and blends' measurements will take
        return RESERVE_MARGIN * (measurements_planned(s) * _measurement_seconds(
            trainer, target, work / "candidate.gguf", src.draft_vocab, yardstick, drafter)
            + s.checkpoints * _pause_seconds(trainer, work))
    seconds = _training_seconds(work, deadline, resume, s.minutes, reserve)
    start_training(trainer, work, s, seconds, resume)
    base = {"adapted_from": init_record(drafter, src.train_metadata), "store": store_dir.name,
            "recorded_train": len(train), "recorded_held_back": len(held), "held_back_measured": yardstick.n_held_back,
            "replayed": n_replay,
            "adapt_settings": {k: [str(x) for x in v] if k == "prompts" else v if k != "replay_dir" else None
                               for k, v in asdict(s).items()}}
    choice = CheckpointChoice.resumed(work / "checkpoint-taus.json",
                                      CheckpointChoice(before["held_back"], _measured(before["general"]), s.general_drop,
                                                       start_everyday=_measured(before["everyday"]),
                                                       start_general_by_category=before["general_by_category"]),
                                      resume)

    def measure(trainer, result, blend: float | None = None) -> dict:
        candidate = work / "candidate.gguf"
        record = base | training_record(trainer, result)
        tensors = None
        if blend is not None:
            tensors = blended(src.tensors, trainer.state_numpy(), blend)
            record |= {"blend": blend, "blended_with": base["adapted_from"]["sha256"]}
        export(trainer, target, candidate, record, src.draft_vocab, force=True, tensors=tensors)
        t = time.time()
        tau = yardstick.tau(candidate)
        errors = {f"tau_{part}_se": paired_error(before.get(f"{part}_per_prompt", []), tau[f"{part}_per_prompt"])
                  for part in ("general", "everyday")}
        return {"tau_held_back": tau["held_back"], "tau_general": _measured(tau["general"]),
                "tau_general_by_category": tau["general_by_category"], "tau_everyday": _measured(tau["everyday"]),
                "tau_everyday_by_category": tau["everyday_by_category"], **errors,
                "measure_seconds": round(time.time() - t, 1)}

    result = train_choosing(trainer, work, seconds, s.checkpoints, choice, measure)
    blend_choosing(trainer, result, work, s.blends, choice, measure)
    best = work / "best.gguf"
    reason = None if choice.improved else choice.refusal(drafter.name, yardstick.n_held_back)
    kept = choice.best
    record = base | training_record(trainer, result) | {
        "tau_before": before, "checkpoints": choice.measured, "kept": kept, "general_drop": s.general_drop,
        # the kept one's, written or not (measured at its checkpoint, along the same continuations)
        "tau_after": {"held_back": kept["tau_held_back"], "general": kept["tau_general"],
                      "general_by_category": kept["tau_general_by_category"], "everyday": kept["tau_everyday"],
                      "everyday_by_category": kept["tau_everyday_by_category"]} if kept else None,
        "written": kept is not None and (reason is None or force)}
    if record["written"]:
        if reason:
            print(f"note: {reason}; writing the best one anyway (--force)", file=sys.stderr)
        copy_into_place(best, out)
    record["minutes"] = round((time.time() - t0) / 60, 1)
    (work / "adapt-record.json").write_text(json.dumps(record, indent=2))
    if not record["written"]:
        raise RunFailure(f"-o {out} not written: {reason}; keep using {drafter.name}, record more requests, or pass "
                         "--force to write the kept checkpoint anyway")
    return record


def _measured(tau: float) -> float | None:
    """None for a set that was not measured (nan)."""
    return None if math.isnan(tau) else tau


def train_choosing(trainer, work: Path, seconds: float, n_checkpoints: int, choice: CheckpointChoice,
                   measure):
    """Train to the end of `seconds` (or of the trainer's rows budget, when its schedule ends there too), pausing
    `n_checkpoints` times, evenly over whichever is further along, to measure the drafter so far
    (`measure(trainer, its validation)`: its τ held back and on the general set); the one `choice` keeps is
    <work>/best.gguf. Returns the last validation."""
    n = max(n_checkpoints, 1)
    every = seconds / n
    rows_every = trainer.total_rows / n if trainer.s.schedule_rows_cap else None
    result = None
    while trainer.seconds_before < seconds and trainer.rows_seen < trainer.total_rows:
        steps = trainer.step
        done = int(trainer.seconds_before / every + 1e-9)
        if rows_every:
            done = max(done, int(trainer.rows_seen / rows_every + 1e-9))
        pause = min(seconds, (done + 1) * every)
        stop_at = min(trainer.total_rows, round((done + 1) * rows_every)) if rows_every else None
        result = trainer.train(work / "checkpoint", progress=False, until_seconds=pause, stop_at=stop_at)
        if trainer.step == steps:              # the schedule's end came first
            break
        point = measured_point(trainer, result, work, choice, measure)
        print(f"checkpoint at {point['train_minutes']:.1f} training minutes (step {point['step']}): τ held back "
              f"{point['tau_held_back']:.3f} (start {choice.start:.3f}){_guard_line(point, choice)}; kept so far: "
              f"{_point_name(choice.best)} ({point['measure_seconds']:.0f} s to measure)", file=sys.stderr)
    return result or trainer.evaluate(trainer.s.eval_seqs)


def measured_point(trainer, result, work: Path, choice: CheckpointChoice, measure, blend: float | None = None) -> dict:
    """The trainer's drafter so far (or its blend with the start) measured and offered to `choice`; the one kept so
    far is <work>/best.gguf, and what was measured is saved for a resumed run."""
    point = {"step": trainer.step, "labelled_rows": trainer.rows_seen,
             "train_minutes": round(trainer.seconds_before / 60, 2)} | ({} if blend is None else {"blend": blend})
    point |= measure(trainer, result, blend)
    if choice.add(point):
        (work / "candidate.gguf").replace(work / "best.gguf")
    choice.save(work / "checkpoint-taus.json")
    return point


def blended(start: dict[str, np.ndarray], adapted: dict[str, np.ndarray], share: float) -> dict[str, np.ndarray]:
    """(1 - share) * start + share * adapted, tensor by tensor; a tensor the start lacks (or has in another shape,
    e.g. a new head) is the adapted one."""
    def mix(k: str, v: np.ndarray) -> np.ndarray:
        if k not in start or start[k].shape != v.shape:
            return v
        return ((1.0 - share) * start[k].astype(np.float32) + share * v).astype(np.float32)
    return {k: mix(k, v) for k, v in adapted.items()}


def blend_choosing(trainer, result, work: Path, shares: tuple[float, ...], choice: CheckpointChoice, measure) -> None:
    """When the last checkpoint lost the guard, look for the largest share of it in a blend with the start that holds
    the guard (a smaller share gives back more of the held-back gain) by bisecting `shares`: what a blend gives back
    grows with the start's share (docs/learning.md), so ceil(log2(n + 1)) blends are measured instead of up to n.
    `choice` takes them as it takes checkpoints. A resumed run does not measure a blend again."""
    checkpoints = [p for p in choice.measured if p.get("blend") is None]
    if not checkpoints or choice.holds(checkpoints[-1]):
        return
    order = sorted(shares, reverse=True)
    lo, hi = 0, len(order)              # the largest share that holds is order[lo:hi]'s first, or none (hi = n)
    while lo < hi:
        mid = (lo + hi) // 2
        share = order[mid]
        point = next((p for p in choice.measured if p.get("blend") == share and p["step"] == trainer.step), None)
        if point is None:
            point = measured_point(trainer, result, work, choice, measure, share)
            print(f"blend of {share:g} of the last checkpoint with the start: τ held back {point['tau_held_back']:.3f} "
                  f"(start {choice.start:.3f}){_guard_line(point, choice)}; kept so far: "
                  f"{_point_name(choice.best)}", file=sys.stderr)
        if choice.holds(point):
            hi = mid
        else:
            lo = mid + 1


def measurements_planned(s: AdaptSettings) -> int:
    """The checkpoints and, at most, the blends blend_choosing measures: what the time box keeps back from training."""
    return s.checkpoints + (math.ceil(math.log2(len(s.blends) + 1)) if s.blends else 0)


def _guard_line(point: dict, choice: CheckpointChoice) -> str:
    """", general 2.100 ± 0.021 (start 2.167), everyday ..." for the sets measured."""
    sets = "".join(f", {name} {point[key]:.3f}{_error(point.get(f'{key}_se'))} (start {start:.3f})"
                   for name, key, start in choice.guard_sets if point.get(key) is not None and start is not None)
    return sets + "".join(f", general's {c} {_category_tau(point, c):.3f} "
                          f"(start {choice.start_general_by_category[c]:.3f}) lost"
                          for c in choice.categories_lost(point))


def _category_tau(point: dict, category: str) -> float:
    """τ of a measurement on one category of the general set (nan where it was not measured)."""
    return (point.get("tau_general_by_category") or {}).get(category, float("nan"))


def _error(se: float | None) -> str:
    return "" if se is None else f" ± {se:.3f}"


def _point_name(point: dict) -> str:
    """"step 11923", or "a blend of 0.8 of step 17883"."""
    step = f"step {point['step']}"
    return step if point.get("blend") is None else f"a blend of {point['blend']:g} of {step}"


def copy_into_place(src: Path, out: Path) -> None:
    """`src` copied to `out` under a temporary name, then renamed: `out` is never a partial file."""
    partial = out.with_name(f".{out.name}.partial")
    shutil.copyfile(src, partial)
    partial.replace(out)


def prepare_data(target: TargetFile, config, pool: list[dict], train: list[Conversation], work: Path,
                 s: AdaptSettings, deadline: float):
    """(the training FeatureDataset, replayed sequences in it): the replay harvested (or taken from the cache)
    while at least a quarter of the box is left, then the recorded requests' features."""
    n_replay = round(s.replay * len(train))
    replay = replay_data(target, list(config.target_layers), pool, n_replay, s, deadline - s.minutes * 15)
    n_replay = min(n_replay, len(replay.index))
    data = build_dataset(work / "data", target, replay, n_replay, train, s.threads)
    target.release_model()               # training wants its memory; the export's load check loads it again
    return data, n_replay


def continued_trainer(target: TargetFile, src, source: str, data, s: AdaptSettings):
    """A Trainer started from the drafter `src` read from `source` (its weights, taps, layers, block size and
    draft vocabulary); start_training lays out its schedule."""
    from .pipeline import drafter_config  # noqa: PLC0415
    from .frozen_weights import embedding_and_head  # noqa: PLC0415
    from .trainer import Trainer, TrainSettings  # noqa: PLC0415
    c = src.config
    settings = TrainSettings(n_layers=c.n_layers, block_size=c.block_size, lr=s.lr, warmup=0.05,
                             rows=s.rows or 10**12, schedule_rows_cap=s.rows is not None,
                             schedule_seconds=None, eval_every=10**9, eval_seqs=16, seed=s.seed, tv=s.tv,
                             init_from_target=False, cut_at_first_error=True, markov_rank=c.markov_rank,
                             confidence_head=c.confidence_head)
    config = replace(drafter_config(target, list(c.target_layers), c.n_layers, c.block_size),
                     mask_token_id=c.mask_token_id)
    embed, head = embedding_and_head(target)
    vocab = None if src.draft_vocab is None else src.draft_vocab.token_ids
    trainer = Trainer(data, config, embed, head, settings, draft_vocab=vocab)
    trainer.arch = target.arch
    trainer.load_weights(src.tensors, source)
    return trainer


def _measurement_seconds(trainer, target: TargetFile, path: Path, vocab, yardstick: Yardstick,
                         drafter: Path) -> float:
    """How long measuring a checkpoint takes, timed before any training time is spent: the start's weights exported
    as a checkpoint is (writing the GGUF, its load check: which also shows the export works) and τ of `drafter`
    along the target's continuations, which the first measurement generates and every later one reuses (that
    first one took ~10x as long: 71 s against 5-6 s on the embedded default, 2 threads)."""
    from .pipeline import export  # noqa: PLC0415
    if yardstick.conts is None:          # the start's τ came from a file: generate the continuations first
        yardstick.tau(drafter)
    t = time.time()
    export(trainer, target, path, {}, vocab, force=True)
    yardstick.tau(drafter)
    seconds = time.time() - t
    target.release_model()               # as prepare_data left it: training wants the memory
    return seconds


def _pause_seconds(trainer, work: Path) -> float:
    """What each checkpoint's pause costs besides its measurement, timed before training: the trainer saves its
    state and measures its validation each time it stops (Trainer.train), outside the training clock (30 s of a
    30-minute box over six pauses on the embedded default, 2 threads, before it was counted)."""
    scratch = work / "pause-timing"
    t = time.time()
    trainer.save(scratch)
    trainer.evaluate(trainer.s.eval_seqs)
    seconds = time.time() - t
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def start_training(trainer, work: Path, s: AdaptSettings, seconds: float, resume: bool) -> None:
    """Warm-up and cosine over `seconds` of training (or over `s.rows` labelled rows, when given and they come
    first); with `resume`, from the work dir's checkpoint."""
    trainer.s.schedule_seconds = seconds
    if resume and (work / "checkpoint" / "ckpt.pt").exists():
        trainer.resume(work / "checkpoint")
        print(f"resumed after {trainer.seconds_before / 60:.1f} of {seconds / 60:.1f} training minutes",
              file=sys.stderr)
    cap = f" or {s.rows:,} labelled rows, whichever comes first," if s.rows else ""
    print(f"training for {(seconds - trainer.seconds_before) / 60:.1f} minutes{cap} on {len(trainer.data.index)} "
          f"sequences (checkpoints in {work / 'checkpoint'}, held-back τ measured at {s.checkpoints} of them)",
          file=sys.stderr)


def _measured_once(path: Path, key: str, run) -> dict:
    """run()'s result, kept in `path` under `key` (the drafter's sha256, the prompts and the settings): a resumed
    run does not measure the same thing again."""
    if path.exists():
        kept = json.loads(path.read_text())
        if kept.get("key") == key:
            return kept["tau"]
    tau = run()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "tau": tau}))
    return tau


def _training_seconds(work: Path, deadline: float, resume: bool, minutes: float, reserve) -> float:
    """The training part of the time box: what the preparation left before `deadline` less `reserve()` (the seconds
    the measurements to come will take, asked only here), at least a quarter of the box; a resumed run keeps the first
    run's (its schedule was laid out over it)."""
    plan = work / "adapt-plan.json"
    if resume and plan.exists():
        return json.loads(plan.read_text())["train_seconds"]
    deadline -= reserve()
    left, least = deadline - time.time(), minutes * 15        # a quarter of the box at least
    if left < least:
        print(f"note: preparing the data and the measurements to come leave {max(left, 0) / 60:.1f} of the "
              f"{minutes:g} minutes for training; training for "
              f"{least / 60:.1f} minutes anyway", file=sys.stderr)
        left = least
    work.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"train_seconds": left}))
    return left


def check_paths(drafter: Path, out: Path, force: bool) -> None:
    """The new drafter never replaces the one it starts from, and another file only with --force."""
    if not drafter.is_file():
        raise UserError(f"-md {drafter}: no such file")
    if out.exists() and (out.samefile(drafter) or out.resolve() == drafter.resolve()):
        raise UserError(f"-o {out}: that is the drafter being adapted (-md); write the adapted one to a new file")
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to overwrite it")
