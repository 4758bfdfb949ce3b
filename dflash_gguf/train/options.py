"""What `train` is asked (its options as one record) and the rules the options must meet, each once in a table,
checked before anything is read (like EngineSettings.validate)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UserError, refuse_first

DEVICES = ("cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class TrainOptions:
    """`train`'s options, as the command takes them (its signature holds the defaults)."""
    model: Path
    out: Path
    prompts: list[Path]                 # empty: the shipped prompt set
    layers: int
    block_size: int
    taps: str
    tokens: int | None                  # 0: every prompt
    harvest_minutes: float | None
    parallel: int
    harvest_processes: int
    rows: int | None
    epochs: float
    max_minutes: float | None
    schedule_minutes: float | None
    lr: float
    distill: float
    tv: float | None                    # None: 0.9, or 0 with --distill (resolved())
    cut_at_first_error: bool
    supervised_slots: int | None
    markov_rank: int
    confidence_head: bool
    short_blocks: float
    loss_vocab_extra: int | None        # None: 2048 on cpu, the whole vocabulary (-1) on cuda (resolved())
    device: str
    n_gpu_layers: int | None            # None: all with cuda, none on cpu (resolved())
    precision: str
    outtype: str
    data_dir: Path | None
    work_dir: Path | None
    resume: Path | None
    seed: int
    draft_vocab: int | None
    import_tokens: Path | None
    init_drafter: Path | None
    threads: int
    chat_template: str | None
    force: bool

    def resolved(self) -> "TrainOptions":
        """The defaults that depend on other options, filled in."""
        return replace(self, tv=(0.9 if self.distill == 0 else 0.0) if self.tv is None else self.tv,
                       loss_vocab_extra=(2048 if self.device == "cpu" else -1) if self.loss_vocab_extra is None
                       else self.loss_vocab_extra,
                       n_gpu_layers=(999 if self.device == "cuda" else 0) if self.n_gpu_layers is None
                       else self.n_gpu_layers)

    def validate(self) -> "TrainOptions":
        """Refuse out-of-range values and options that cannot combine, with the option that sets them.
        Call on resolved() options."""
        o = self
        refuse_first((
            (0.0 <= o.distill <= 1.0, "--distill", o.distill, "choose a share between 0 and 1"),
            (0.0 <= o.tv <= 1.0 and o.distill + o.tv <= 1.0, "--tv", o.tv,
             f"choose a share between 0 and 1 that, with --distill {o.distill}, adds up to at most 1"),
            (0.0 <= o.short_blocks <= 1.0, "--short-blocks", o.short_blocks, "choose a share between 0 and 1"),
            (o.supervised_slots is None or 1 <= o.supervised_slots < o.block_size, "--supervised-slots",
             o.supervised_slots, f"choose 1..{o.block_size - 1} (block size {o.block_size})"),
            (o.markov_rank >= 0, "--markov-rank", o.markov_rank,
             "choose 0 (no Markov head) or a rank of at least 1 (e.g. 64; a multiple of 32 keeps W1 in Q8_0)"),
            (o.markov_rank or not o.confidence_head, "--confidence-head", None,
             "it reads the Markov head's W1: add --markov-rank R (e.g. 64)"),
            (o.harvest_processes >= 1, "--harvest-processes", o.harvest_processes, "must be >= 1"),
            (o.device in DEVICES, "--device", o.device, f"use {' or '.join(DEVICES)}"),
            (o.precision in PRECISIONS, "--precision", o.precision, "use auto, fp32 or bf16"),
        ))
        return self

    def check_files(self) -> None:
        """The files the options name exist (and the output is not overwritten unasked)."""
        if not self.model.is_file():
            raise UserError(f"-m {self.model}: no such file")
        if self.resume is not None and not (self.resume / "checkpoint" / "ckpt.pt").is_file():
            raise UserError(f"--resume {self.resume}: no checkpoint there (expected {self.resume}/checkpoint/ckpt.pt)")
        for flag, path in (("--init-drafter", self.init_drafter), ("--import-tokens", self.import_tokens)):
            if path is not None and not path.is_file():
                raise UserError(f"{flag} {path}: no such file")
        if self.out.exists() and not self.force:
            raise UserError(f"{self.out} exists; pass --force to overwrite it")
