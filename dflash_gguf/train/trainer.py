"""The DFlash training objective and loop (dflash-spec.md §3.1), on CPU or CUDA.

Loss (objective.py): cross-entropy of block slot k (k ≥ 1) against the target's token at anchor+k, weighted
exp(-(k-1)/γ) — early slots matter most, since a rejection ends the accepted run. With `distill` > 0,
that share of the loss is the cross-entropy against the target's own top-K distribution at the same
position (kept at harvest time) instead of its one token; with `tv` > 0, that share is the total variation
to it. `cut_at_first_error` drops the rows after each block's first wrong slot; `supervised_slots` the
slots past it.
With `markov_rank` > 0 the drafter is a DSpark one: a low-rank Markov head (drafter/markov.py) adds
W2·W1[previous token] to each slot's logits, teacher-forced on the target's tokens, and the same objective
applies to the combined logits. `confidence_head` adds DeepSpec's confidence head on top of it: sigmoid(proj([h;
W1[prev]])) learns, by binary cross-entropy, whether each slot's argmax is the target's token given the true tokens
before it (the acceptance of that slot once the slots before it were accepted). Its inputs are detached: it
reads the drafter and changes nothing the drafter learns.
The target's token embedding and LM head are frozen; only the drafter learns. Training is scheduled by
labelled rows seen (block rows with a label), so a run can stop and resume anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..drafter.config import DrafterConfig
from .dataset import FeatureDataset, PackedBlocks
from .objective import row_losses, rows_up_to_first_error, slot_weights
from .precision import autocast_dtype_name


@dataclass
class TrainSettings:
    n_layers: int = 2
    block_size: int = 8
    gamma: float | None = None          # None: 7 for block 16, 4 for block 8 (published defaults), else B/2
    # One sequence and 12 anchor blocks per step: at a fixed row budget, more and smaller steps trained much better
    # on CPU (val loss 4.16 vs 4.99 for 4 × 48 at 250k rows; docs/scaling.json)
    anchors_per_seq: int = 12
    seqs_per_step: int = 1
    short_blocks: float = 0.0           # share of training blocks cut to 2..B-1 rows (CPU engines draft short)
    lr: float = 8e-4
    weight_decay: float = 0.01
    warmup: float = 0.04                # share of the rows budget
    grad_clip: float = 1.0
    epochs: float = 1.0                 # rows budget, when `rows` is not set: epochs x written tokens x (B-1)
    rows: int | None = None             # labelled rows to train on (the schedule runs over them)
    max_seconds: float | None = None    # stop early (the schedule does not change)
    # the warm-up and cosine run over this many training seconds instead of the rows budget (a time-boxed
    # window, e.g. a lent GPU, whose throughput is not known in advance); training ends when they are spent
    schedule_seconds: float | None = None
    # with schedule_seconds: the schedule also ends at the rows budget, whichever of the two is spent first (a
    # time box whose training should not grow with the machine's speed: train --adapt --rows)
    schedule_rows_cap: bool = False
    eval_every: int = 100
    eval_seqs: int = 64                 # validation sequences per evaluation (every anchor of each)
    ckpt_minutes: float = 5.0
    seed: int = 0
    device: str = "cpu"
    precision: str = "auto"             # auto | fp32 | bf16 (auto: bf16 only where the hardware has it)
    init_from_target: bool = True       # start the draft layers from the target's last layers
    # None: softmax over the whole vocabulary (or the draft vocabulary, when one is given). N: over the tokens
    # in the data plus N others drawn afresh each step (the frozen LM head is most of the FLOPs on CPU).
    loss_vocab_extra: int | None = None
    distill: float = 0.0                # share of the loss against the target's top-K distribution
    tv: float = 0.0                     # share of the loss that is the total variation to it
    cut_at_first_error: bool = False    # no loss on a block's rows after its first wrong slot
    supervised_slots: int | None = None  # only slots 1..N carry loss
    grow_data: bool = False             # re-read the dataset after each pass (a harvest is still writing it)
    markov_rank: int = 0                # DSpark Markov head of this rank on the logits (0: none, a DFlash drafter)
    confidence_head: bool = False       # with markov_rank: DeepSpec's confidence head, trained on slot acceptance

    def gamma_value(self) -> float:
        if self.gamma is not None:
            return self.gamma
        return {16: 7.0, 8: 4.0}.get(self.block_size, self.block_size / 2)


@dataclass
class EvalResult:
    loss: float
    slot_accept: list[float]            # P(slot k right | slots < k right), along the walk
    mean_accepted: float                # accepted drafts per block, walking each span as a greedy run would
    anchor_tau: float = float("nan")    # 1 + leading correct slots averaged over every anchor (biased upward)

    @property
    def tau(self) -> float:
        return 1.0 + self.mean_accepted


class Trainer:
    def __init__(self, data: FeatureDataset, config: DrafterConfig, embed: np.ndarray, head: np.ndarray,
                 settings: TrainSettings, target_layers: dict | None = None, draft_vocab: np.ndarray | None = None):
        """draft_vocab: sorted token ids the drafter may propose (its reduced head); the loss and the
        validation then use exactly those, as inference will."""
        import torch  # noqa: PLC0415

        from ..drafter.torch_ref import DFlashDrafter  # noqa: PLC0415
        self.torch = torch
        torch.manual_seed(settings.seed)
        if settings.markov_rank:        # DSpark, rows 1..n as DFlash (sample_from_anchor false): the harvest's layout
            config = dataclasses.replace(config, markov_rank=settings.markov_rank, sample_from_anchor=False,
                                         confidence_head=settings.confidence_head)
        elif settings.confidence_head:
            from ..errors import UserError  # noqa: PLC0415
            raise UserError("a confidence head reads the Markov head's W1: add --markov-rank R (e.g. 64)")
        self.data, self.config, self.s = data, config, settings
        self.device = torch.device(settings.device)
        self.embed = torch.tensor(embed, dtype=torch.float32, device=self.device)      # [V, H] frozen
        self.draft_vocab = None if draft_vocab is None else torch.as_tensor(np.asarray(draft_vocab, np.int64),
                                                                             device=self.device)
        rows = head if draft_vocab is None else head[np.asarray(draft_vocab)]
        self.head = torch.tensor(rows, dtype=torch.float32, device=self.device)        # [V', H] frozen
        self.n_vocab = head.shape[0]
        self.model = DFlashDrafter(config, markov_columns=len(rows)).to(self.device)
        if settings.init_from_target and target_layers:
            self._init_from_target(target_layers)
        self.weights = torch.tensor(slot_weights(config.block_size, settings.gamma_value(),
                                                 settings.supervised_slots), dtype=torch.float32,
                                    device=self.device)
        precision = None if settings.precision == "auto" else settings.precision
        cuda_bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        name = autocast_dtype_name(self.device.type, cuda_bf16=cuda_bf16, override=precision)
        self.autocast = getattr(torch, name) if name else None
        self.train_ids, self.val_ids = data.split()
        self.rng = np.random.default_rng(settings.seed)
        written = data.n_tokens(self.train_ids)
        self.total_rows = settings.rows or int(settings.epochs * written * (config.block_size - 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay,
                                     betas=(0.9, 0.95))
        self.step = 0
        self.rows_seen = 0
        self.seconds_before = 0.0           # training time spent before a resume
        self.history: list[dict] = []
        self._order_iter = None             # kept across train() calls: stopping at a snapshot changes nothing
        use_extra = settings.loss_vocab_extra is not None and draft_vocab is None
        self.data_vocab = data.vocabulary() if use_extra else None

    def _init_from_target(self, layers: dict) -> None:
        """Draft layers start as copies of the target's last layers; fc starts by passing the deepest tap."""
        torch = self.torch
        sd = self.model.state_dict()
        with torch.no_grad():
            for name, arr in layers.items():
                if name in sd and tuple(sd[name].shape) == arr.shape:
                    sd[name].copy_(torch.tensor(arr))
            H, k = self.config.hidden_size, self.config.n_taps
            fc = torch.randn(H, k * H) * 0.02 / math.sqrt(k)
            fc[:, (k - 1) * H:] += torch.eye(H)
            sd["fc.weight"].copy_(fc)
        self.model.load_state_dict(sd)

    def load_weights(self, tensors: dict[str, np.ndarray], source: str) -> None:
        """Start from a drafter's z-lab-named tensors (its own head rows, if any, are not the drafter's). A
        DFlash drafter continued with a Markov head keeps the head's no-op start; a DSpark drafter's W2 (over
        the whole vocabulary) gives the rows of this trainer's columns."""
        from ..errors import UserError  # noqa: PLC0415
        sd = self.model.state_dict()
        tensors = dict(tensors)
        w2 = "markov_head.markov_w2.weight"
        if w2 in tensors and w2 in sd and self.draft_vocab is not None:
            tensors[w2] = tensors[w2][self.draft_vocab.cpu().numpy()]
        has_head = any(k.startswith("markov_head.") for k in tensors)
        fresh = {k for k in sd if k.startswith("markov_head.") and not has_head}      # starts as a no-op
        fresh |= {k for k in sd if k.startswith("confidence_head.") and k not in tensors}
        if has_head and self.model.markov_head is None:
            print(f"note: {source}: its Markov head is not trained on (train with --markov-rank to keep one)",
                  file=sys.stderr)
        wrong = [k for k in sd if k not in fresh
                 and (k not in tensors or tuple(tensors[k].shape) != tuple(sd[k].shape))]
        if wrong:
            raise UserError(f"{source}: not a drafter of this shape ({', '.join(wrong[:4])} missing or of another "
                            "shape); use the same --layers, --markov-rank and target")
        # copies: a GGUF's tensors may be read-only views of the mapped file
        sd.update({k: self.torch.from_numpy(np.array(tensors[k], order="C")) for k in sd if k not in fresh})
        self.model.load_state_dict(sd)

    # -- objective ----------------------------------------------------------------------------
    def _columns(self, ids, vocab):
        """Positions of token `ids` among the loss columns `vocab` (sorted), -100 where absent."""
        torch = self.torch
        pos = torch.searchsorted(vocab, ids.clamp(min=0)).clamp(max=len(vocab) - 1)
        return torch.where((vocab[pos] == ids) & (ids >= 0), pos, torch.full_like(pos, -100))

    def forward(self, pb: PackedBlocks, vocab: np.ndarray | None = None, with_confidence: bool = False):
        """Logits [R, V'] of the rows with labels (slots ≥ 1), their labels as column indices (-100: a token
        outside the columns) and slots. Columns: the draft vocabulary if the trainer has one, else `vocab`
        ids (sorted, containing every label) or the whole vocabulary. With a Markov head the logits include
        its bias, given the target's token before each row. with_confidence: a fourth item, the confidence
        head's logit of each row (its inputs detached)."""
        torch = self.torch
        dev = self.device
        emb = self.embed[torch.as_tensor(pb.block_tokens, device=dev)][None]                 # [1, S, H]
        ctx = torch.as_tensor(np.asarray(pb.ctx_feats, dtype=np.float32), device=dev)[None]  # [1, C, k*H]
        C = ctx.shape[1]
        hidden = self.model(emb, ctx, torch.as_tensor(pb.block_pos, device=dev)[None],
                            torch.arange(C, device=dev)[None], torch.as_tensor(pb.mask, device=dev)[None])
        rows = torch.as_tensor(pb.slot > 0, device=dev)
        labels = torch.as_tensor(pb.labels, device=dev)[rows]
        if self.draft_vocab is not None:
            logits = hidden[0][rows] @ self.head.t()                                          # [R, K]
            labels = self._columns(labels, self.draft_vocab)
        elif vocab is None:
            logits = hidden[0][rows] @ self.head.t()                                          # [R, V]
        else:
            ids = torch.as_tensor(vocab, device=dev)
            logits = hidden[0][rows] @ self.head[ids].t()                                     # [R, V']
            labels = torch.searchsorted(ids, labels)
        if self.model.markov_head is not None:         # teacher forcing: the target's token before each row
            from ..drafter.markov import teacher_forced_prev  # noqa: PLC0415
            prev = torch.as_tensor(teacher_forced_prev(pb.block_tokens, pb.labels, pb.slot), device=dev)[rows]
            columns = None if self.draft_vocab is not None or vocab is None else torch.as_tensor(vocab, device=dev)
            logits = logits + self.model.markov_head.bias(prev, columns)
        slots = torch.as_tensor(pb.slot, device=dev)[rows]
        if with_confidence:
            conf = self.model.confidence_head.logit(hidden[0][rows].detach(),
                                                    self.model.markov_head.markov_w1(prev).detach())
            return logits, labels, slots, conf
        return logits, labels, slots

    def confidence_loss(self, conf, logits, labels, pb: PackedBlocks):
        """Binary cross-entropy of the confidence logits against each row's acceptance given the true tokens
        before it (its argmax is the target's token); a row whose token the drafter cannot propose is a miss."""
        torch = self.torch
        has_token = torch.as_tensor(pb.labels[pb.slot > 0] >= 0, device=self.device)
        accepted = (logits.argmax(-1) == labels).float()
        per_row = torch.nn.functional.binary_cross_entropy_with_logits(conf.float(), accepted, reduction="none")
        return (per_row * has_token).sum() / has_token.sum().clamp(min=1)

    def teacher(self, pb: PackedBlocks, vocab: np.ndarray | None = None):
        """[R, V'] soft targets: the target's top-K probabilities at each labelled row, renormalised over the
        loss columns; None where the dataset kept no probabilities."""
        torch = self.torch
        if pb.teacher_ids is None:
            return None
        rows = pb.slot > 0
        ids = torch.as_tensor(pb.teacher_ids[rows], device=self.device).long()              # [R, K]
        p = torch.as_tensor(pb.teacher_p[rows], device=self.device)
        columns = self.draft_vocab if self.draft_vocab is not None else (
            torch.as_tensor(vocab, device=self.device) if vocab is not None else None)
        if columns is None:
            cols = torch.where(ids >= 0, ids, torch.full_like(ids, -100))
            width = self.n_vocab
        else:
            cols = self._columns(ids, columns)
            width = len(columns)
        p = torch.where(cols >= 0, p, torch.zeros_like(p))
        target = torch.zeros(len(ids), width + 1, device=self.device)
        target.scatter_add_(1, torch.where(cols >= 0, cols, torch.full_like(cols, width)), p)
        target = target[:, :width]
        return target / target.sum(1, keepdim=True).clamp(min=1e-6)

    def loss(self, logits, labels, slots, soft=None):
        torch = self.torch
        known = labels >= 0                          # a label outside the columns can never be proposed
        w = self.weights[slots] * known
        if self.s.cut_at_first_error:
            w = w * rows_up_to_first_error(logits.argmax(-1) == labels, slots)
        logp = torch.log_softmax(logits.float(), dim=-1)
        per_row = row_losses(logp, labels, soft, self.s.distill, self.s.tv)
        return (per_row * w).sum() / w.sum().clamp(min=1e-6)

    # -- loop -----------------------------------------------------------------------------------
    def lr_at(self, rows_seen: int, seconds: float | None = None) -> float:
        """Linear warm-up, then cosine to zero at the end of the rows budget (of schedule_seconds, when set:
        then `seconds` of training so far place the step on the schedule; with schedule_rows_cap, whichever of
        seconds and rows is further along)."""
        if self.s.schedule_seconds:
            done = min(1.0, (seconds or 0.0) / self.s.schedule_seconds)
            if self.s.schedule_rows_cap:
                done = max(done, min(1.0, rows_seen / max(1, self.total_rows)))
            if done < self.s.warmup:
                return self.s.lr * max(done / self.s.warmup, 1e-3)
            progress = (done - self.s.warmup) / max(1e-9, 1.0 - self.s.warmup)
        else:
            warm = max(1, int(self.s.warmup * self.total_rows))
            if rows_seen < warm:
                return self.s.lr * (rows_seen + 1) / warm
            progress = (rows_seen - warm) / max(1, self.total_rows - warm)
        return self.s.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    def _precision(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return self.torch.autocast(self.device.type, dtype=self.autocast)

    def _loss_vocab(self) -> np.ndarray | None:
        if self.data_vocab is None:
            return None
        extra = self.rng.choice(self.n_vocab, size=min(self.s.loss_vocab_extra, self.n_vocab), replace=False)
        return np.union1d(self.data_vocab, extra)

    def train(self, out_dir: Path, progress: bool = True, stop_at: int | None = None,
              until_seconds: float | None = None) -> EvalResult:
        """Train to the end of the rows budget, or only up to `stop_at` rows or `until_seconds` of training in
        all (the schedule stays the whole budget's, so a later call goes on where this one stopped: snapshots
        of one run; time between the calls is not training time)."""
        torch = self.torch
        end = min(self.total_rows, stop_at or self.total_rows)
        from tqdm import tqdm  # noqa: PLC0415
        t0 = time.time() - self.seconds_before
        last_ckpt = time.time()
        if self._order_iter is None:
            self._order_iter = self._order()
        order = self._order_iter
        bar = tqdm(total=end, initial=self.rows_seen, disable=not progress, desc="train", unit="row",
                   unit_scale=True)
        last_eval = None
        while self.rows_seen < end:
            elapsed = time.time() - t0
            limits = (self.s.max_seconds, self.s.schedule_seconds, until_seconds)
            if any(limit and elapsed > limit for limit in limits):
                break
            lr = self.lr_at(self.rows_seen, elapsed)
            for group in self.opt.param_groups:
                group["lr"] = lr
            total, rows = 0.0, 0
            packs = [self._next_blocks(order) for _ in range(self.s.seqs_per_step)]
            vocab = self._loss_vocab()          # after the packs: a data refresh may have brought new tokens
            for pb in packs:
                with self._precision():
                    out = self.forward(pb, vocab, with_confidence=self.model.confidence_head is not None)
                    soft = self.teacher(pb, vocab) if self.s.distill or self.s.tv else None
                    loss = self.loss(*out[:3], soft)
                    if len(out) == 4:         # its own parameters only (detached inputs; Adam: no weight needed)
                        loss = loss + self.confidence_loss(out[3], out[0], out[1], pb)
                    loss = loss / self.s.seqs_per_step
                value = loss.item()
                if not math.isfinite(value):
                    self._stop_non_finite(value, out_dir)
                loss.backward()
                total += value
                rows += int((pb.slot > 0).sum())
            torch.nn.utils.clip_grad_norm_(self._drafter_parameters(), self.s.grad_clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            self.rows_seen += rows
            self.seconds_before = time.time() - t0
            rec = {"step": self.step, "rows": self.rows_seen, "loss": total, "lr": lr,
                   "seconds": self.seconds_before, "rows_per_s": self.rows_seen / max(self.seconds_before, 1e-9),
                   "train_sequences": len(self.train_ids)}
            if self.step % self.s.eval_every == 0 or self.rows_seen >= end:
                last_eval = self.evaluate(self.s.eval_seqs)
                rec |= {"val_loss": last_eval.loss, "val_tau": last_eval.tau, "val_anchor_tau": last_eval.anchor_tau,
                        "val_slot_accept": [round(x, 3) for x in last_eval.slot_accept]}
            self.history.append(rec)
            if time.time() - last_ckpt > self.s.ckpt_minutes * 60:
                self.save(out_dir)
                last_ckpt = time.time()
            bar.set_postfix(loss=f"{total:.3f}", tau=f"{last_eval.tau:.2f}" if last_eval else "-",
                            rows_s=f"{rec['rows_per_s']:.0f}")
            bar.update(rows)
        bar.close()
        self.save(out_dir)
        return self.evaluate(self.s.eval_seqs) if last_eval is None or self.history[-1].get("val_tau") is None \
            else last_eval

    def _stop_non_finite(self, value: float, out_dir: Path) -> None:
        """One clear line instead of training on: a NaN/inf loss never recovers, and the weights of the last
        finite step are kept in the checkpoint."""
        from ..errors import RunFailure  # noqa: PLC0415
        self.save(out_dir)
        ranges = self.data.root / "ranges.json"
        raise RunFailure(f"training stopped: the loss is {value} at step {self.step + 1} ({self.rows_seen:,} rows "
                         f"in); the last finite weights are in {out_dir} (--resume). Tap ranges of the data: "
                         f"{ranges if ranges.exists() else 'not recorded'}; try --precision fp32 or a lower --lr")

    def _order(self):
        while True:
            if self.s.grow_data:
                self.data.refresh()
                self.train_ids, self.val_ids = self.data.split()
                if self.data_vocab is not None:
                    self.data_vocab = self.data.vocabulary()
            ids = list(self.train_ids)
            self.rng.shuffle(ids)
            yield from ids

    def _next_blocks(self, order) -> PackedBlocks:
        while True:
            pb = self.data.blocks(next(order), self.s.anchors_per_seq, self.config.block_size,
                                  self.config.mask_token_id, self.rng, self.s.short_blocks)
            if pb is not None:
                return pb

    def evaluate(self, max_seqs: int = 64, chunk: int = 48) -> EvalResult:
        """Loss and greedy acceptance on held-out sequences, over the columns inference proposes from: every
        anchor of each target-written span is drafted, then the span is walked as a greedy speculative run
        walks it (acceptance.py), so this τ and the engine's count the same thing."""
        from ..engine.acceptance import Walk, leading_correct  # noqa: PLC0415
        torch = self.torch
        B = self.config.block_size
        loss_sum, weight_sum, anchor_runs = 0.0, 0.0, []
        walk = Walk()
        self.model.eval()
        with torch.no_grad():
            for seq in self.val_ids[:max_seqs]:
                for anchors in self.data.walk_anchors(seq):
                    runs = []
                    for i in range(0, len(anchors), chunk):
                        pb = self.data.anchor_blocks(seq, anchors[i:i + chunk], B, self.config.mask_token_id)
                        logits, labels, slots = self.forward(pb)
                        w = float((self.weights[slots] * (labels >= 0)).sum())
                        loss_sum += float(self.loss(logits, labels, slots)) * w
                        weight_sum += w
                        right = ((logits.argmax(-1) == labels) & (labels >= 0)).view(-1, B - 1).cpu().numpy()
                        runs.append(leading_correct(right))
                    runs = np.concatenate(runs)
                    walk.add_span(runs, B - 1)
                    anchor_runs.append(runs)
        self.model.train()
        anchor_tau = 1.0 + float(np.concatenate(anchor_runs).mean()) if anchor_runs else float("nan")
        return EvalResult(loss_sum / weight_sum if weight_sum else float("nan"), walk.slot_accept, walk.tau - 1.0,
                          anchor_tau)

    def _drafter_parameters(self):
        """Every parameter but the confidence head's: its gradient never scales the drafter's steps."""
        head = self.model.confidence_head
        skip = set() if head is None else {id(p) for p in head.parameters()}
        return [p for p in self.model.parameters() if id(p) not in skip]

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, out_dir: Path) -> None:
        torch = self.torch
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / "ckpt.pt.tmp"
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "rows_seen": self.rows_seen, "total_rows": self.total_rows,
                    "rng": self.rng.bit_generator.state, "settings": asdict(self.s),
                    "seconds": self.seconds_before, "config": self.config.to_json()}, tmp)
        tmp.replace(out_dir / "ckpt.pt")
        (out_dir / "history.json").write_text(json.dumps(self.history))

    def resume(self, out_dir: Path) -> None:
        torch = self.torch
        ck = torch.load(out_dir / "ckpt.pt", map_location=self.device, weights_only=False)
        rank = ck.get("settings", {}).get("markov_rank", 0)
        if ck.get("settings", {}).get("confidence_head", False) != self.s.confidence_head:
            from ..errors import UserError  # noqa: PLC0415
            raise UserError(f"{out_dir}: this checkpoint was trained {'with' if not self.s.confidence_head else 'without'}"
                            " --confidence-head; resume it the same way")
        if rank != self.s.markov_rank:
            from ..errors import UserError  # noqa: PLC0415
            raise UserError(f"{out_dir}: this checkpoint was trained with --markov-rank {rank}, not "
                            f"{self.s.markov_rank}; resume it with --markov-rank {rank}")
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.step = ck["step"]
        self.rows_seen = ck.get("rows_seen", 0)
        self.seconds_before = ck.get("seconds", 0.0)
        self.rng.bit_generator.state = ck["rng"]
        hist = out_dir / "history.json"
        self.history = json.loads(hist.read_text()) if hist.exists() else []

    def state_numpy(self) -> dict[str, np.ndarray]:
        """z-lab-named tensors, each over the whole vocabulary (the Markov W2 too; zero outside the draft
        vocabulary), as the GGUF writer takes them."""
        out = {k: v.detach().float().cpu().numpy() for k, v in self.model.state_dict().items()}
        w2 = "markov_head.markov_w2.weight"
        if w2 in out and self.draft_vocab is not None:
            from ..drafter.draft_vocab import rows_over_vocab  # noqa: PLC0415
            out[w2] = rows_over_vocab(out[w2], self.draft_vocab.cpu().numpy(), self.n_vocab)
        return out
