"""The rules `train`'s options must meet, each once in a table, checked before anything is read (like
EngineSettings.validate). The options are the command's parameters (train/commands.py: names, types, defaults),
passed on as one namespace."""

from __future__ import annotations

from types import SimpleNamespace

from ..errors import UserError, refuse_first

DEVICES = ("cpu", "cuda")
# peak learning rates: training from scratch, and --adapt's (lower: at 4e-4 no checkpoint held the general set on
# either recorded persona, docs/learning.md)
TRAIN_LR = 8e-4
ADAPT_LR = 1.5e-4
PRECISIONS = ("auto", "fp32", "bf16")
# --adapt: the last checkpoint's shares in the blends with the start tried, in this order, when it lost the guard
BLENDS = (0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)


def resolved(options: dict) -> SimpleNamespace:
    """The options with the defaults that depend on other options filled in: --tv (0.9, or 0 with --distill or --adapt),
    --loss-vocab-extra (2048 on cpu, the whole vocabulary, -1, on cuda), -ngl (all with cuda, none on cpu)."""
    o = SimpleNamespace(**options)
    if o.tv is None:                        # --adapt: hard labels unless --tv asks its data to keep the top-k
        o.tv = 0.0 if o.adapt is not None else 0.9 if o.distill == 0 else 0.0
    if o.loss_vocab_extra is None:
        o.loss_vocab_extra = 2048 if o.device == "cpu" else -1
    if o.n_gpu_layers is None:
        o.n_gpu_layers = 999 if o.device == "cuda" else 0
    if o.lr is None:
        o.lr = ADAPT_LR if o.adapt is not None else TRAIN_LR
    o.blend_shares = blend_shares(o.blends)
    return o


def blend_shares(spec: str) -> tuple[float, ...] | None:
    """--blends "0.9,0.8" → (0.9, 0.8); "none" → (); None where the spec is not a list of numbers."""
    if spec.strip().lower() == "none":
        return ()
    try:
        return tuple(float(x) for x in spec.split(",") if x.strip())
    except ValueError:
        return None


def validate(o: SimpleNamespace) -> SimpleNamespace:
    """Refuse out-of-range values and options that cannot combine, with the option that sets them."""
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
        (o.parallel == "auto" or (o.parallel.isdigit() and int(o.parallel) >= 1), "--parallel", o.parallel,
         "a number of sequences >= 1, or auto"),
        (o.harvest_processes >= 1, "--harvest-processes", o.harvest_processes, "must be >= 1"),
        (o.device in DEVICES, "--device", o.device, f"use {' or '.join(DEVICES)}"),
        (o.precision in PRECISIONS, "--precision", o.precision, "use auto, fp32 or bf16"),
        (o.adapt is None or o.model_draft is not None, "--adapt", None,
         "give the drafter to continue with -md DRAFTER.gguf (the new one goes to -o)"),
        (o.model_draft is None or o.adapt is not None, "-md", None,
         "is the drafter --adapt continues; to start a new training from a drafter use --init-drafter"),
        (o.adapt is None or not (o.init_drafter or o.import_tokens), "--adapt", None,
         "trains on the recorded requests (--prompts: the drafter's own training prompts, for the replay): "
         "leave out --init-drafter and --import-tokens"),
        (o.adapt is None or not o.distill, "--distill", o.distill, "--adapt trains on hard labels, or with --tv "
         "SHARE on the total variation to the target's top-8 as well; leave out --distill"),
        (0 < o.replay <= 10, "--replay", o.replay, "choose a share > 0 (1: as many replayed as recorded) up to 10"),
        (o.max_minutes is None or o.max_minutes > 0, "--max-minutes", o.max_minutes, "must be > 0"),
        (o.rows is None or o.rows > 0, "--rows", o.rows, "must be > 0"),
        (o.eval_prompts >= 0, "--eval-prompts", o.eval_prompts, "must be >= 0"),
        (o.general_drop >= 0, "--general-drop", o.general_drop, "must be >= 0 (a fall in τ the checkpoint may have)"),
        (o.blend_shares is not None and all(0 < x < 1 for x in o.blend_shares), "--blends", o.blends,
         "give the last checkpoint's shares, each between 0 and 1 (e.g. 0.9,0.8,0.7), or none"),
    ))
    return o


def check_files(o: SimpleNamespace) -> None:
    """The files the options name exist (and the output is not overwritten unasked)."""
    if not o.model.is_file():
        raise UserError(f"-m {o.model}: no such file")
    if o.resume is not None and not (o.resume / "checkpoint" / "ckpt.pt").is_file():
        raise UserError(f"--resume {o.resume}: no checkpoint there (expected {o.resume}/checkpoint/ckpt.pt)")
    for flag, path in (("--init-drafter", o.init_drafter), ("--import-tokens", o.import_tokens)):
        if path is not None and not path.is_file():
            raise UserError(f"{flag} {path}: no such file")
    if o.out.exists() and not o.force:
        raise UserError(f"{o.out} exists; pass --force to overwrite it")
