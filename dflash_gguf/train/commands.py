"""`dflash-gguf train`: distil a DFlash drafter for a GGUF target."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..engine_options import chat_template_option
from .options import ADAPT_LR, BLENDS, TRAIN_LR


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        model: Path = typer.Option(..., "-m", "--model", help="target GGUF (the teacher)"),
        out: Path = typer.Option(..., "-o", "--out", help="drafter GGUF to write"),
        prompts: list[Path] = typer.Option([], "--prompts", help="JSONL files (.gz too) with a 'prompt' field "
                                           "(default: the shipped licensed prompt set; with --adapt: the drafter's "
                                           "training prompts, for the replay and the general set)"),
        layers: int = typer.Option(2, "--layers", help="draft layers"),
        block_size: int = typer.Option(8, "--block-size"),
        taps: str = typer.Option("auto", "--taps", help="auto | comma-separated target layer ids"),
        tokens: Optional[int] = typer.Option(300_000, "--tokens", help="tokens of training text the dataset holds "
                                             "(the harvest stops there; 0: every prompt)"),
        harvest_minutes: Optional[float] = typer.Option(None, "--harvest-minutes",
                                                        help="stop harvesting after this long (resumable)"),
        parallel: str = typer.Option("8", "--parallel", help="sequences generated together while harvesting; "
                                     "auto: time 4, 8, 16 and 32 on the run's prompts first (~1 min), keep the fastest"),
        harvest_processes: int = typer.Option(1, "--harvest-processes", help="harvest in N processes side by "
                                              "side (with -t 1: faster than one N-threaded one on a busy CPU)"),
        rows: Optional[int] = typer.Option(None, "--rows", help="labelled block rows to train on (the schedule "
                                           "runs over them; default: --epochs over the data); with --adapt: at "
                                           "most this many, the schedule ending at them or at --max-minutes, "
                                           "whichever comes first (default: the time box alone)"),
        epochs: float = typer.Option(2.0, "--epochs"),
        max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="stop training after this long "
                                                    "(resume later with --resume); with --adapt: the whole run, "
                                                    "its τ measurements included (default 20)"),
        schedule_minutes: Optional[float] = typer.Option(None, "--schedule-minutes", help="a time-boxed run: "
                                                         "warm-up and cosine over this many minutes of training, "
                                                         "which then ends (instead of over --rows)"),
        lr: Optional[float] = typer.Option(None, "--lr", help=f"peak learning rate (default: {TRAIN_LR:g}; "
                                           f"{ADAPT_LR:g} with --adapt)"),
        distill: float = typer.Option(0.0, "--distill", help="share of the loss against the target's top-k "
                                      "probabilities kept at harvest time (0: hard labels only)"),
        tv: Optional[float] = typer.Option(None, "--tv", help="share of the loss that is the total variation to "
                                           "the target's top-k probabilities (1 - the chance a drafted token is "
                                           "accepted); default 0.9, or 0 with --distill or --adapt (with --adapt "
                                           "its recorded and replayed data then keep the target's top-8; "
                                           "docs/training-ab.md, docs/learning.md)"),
        cut_at_first_error: bool = typer.Option(True, "--cut-at-first-error/--no-cut-at-first-error",
                                                help="no loss on a block's rows after the drafter's first wrong "
                                                     "slot (+0.06 engine τ at equal compute: docs/training-ab.md)"),
        supervised_slots: Optional[int] = typer.Option(None, "--supervised-slots", help="only block slots "
                                                       "1..N carry loss"),
        markov_rank: int = typer.Option(0, "--markov-rank", help="add a DSpark Markov head of this rank "
                                        "(W2·W1[previous token] on each slot's logits, chained on the drafted "
                                        "tokens): a DSpark drafter; 0: none, a DFlash drafter"),
        confidence_head: bool = typer.Option(False, "--confidence-head", help="with --markov-rank: add DeepSpec's "
                                             "confidence head, trained to predict each slot's acceptance"),
        short_blocks: float = typer.Option(0.0, "--short-blocks", help="share of training blocks cut to 2..B-1 "
                                           "rows (CPU engines draft n tokens with n+1 rows)"),
        loss_vocab_extra: Optional[int] = typer.Option(
            None, "--loss-vocab-extra", help="without --draft-vocab: softmax over the data's tokens plus N random "
            "others per step; -1: the whole vocabulary (default: 2048 on cpu, the whole vocabulary on cuda)"),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda (torch training; the harvest offloads "
                                   "the target with -ngl)"),
        n_gpu_layers: Optional[int] = typer.Option(None, "-ngl", "--n-gpu-layers",
                                                   help="target layers on the GPU while harvesting "
                                                        "(default: all with --device cuda)"),
        precision: str = typer.Option("auto", "--precision", help="auto | fp32 | bf16 (auto: bf16 only where "
                                      "the hardware computes it natively)"),
        outtype: str = typer.Option("q8_0", "--outtype"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="harvested data (default: the user "
                                                "cache, keyed by target sha256 + prompt set + seed; with --adapt: "
                                                "the replayed data)"),
        work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="checkpoints (default: the user cache)"),
        resume: Optional[Path] = typer.Option(None, "--resume", help="continue training from the checkpoint "
                                              "in this work dir"),
        seed: int = typer.Option(0, "--seed"),
        draft_vocab: Optional[int] = typer.Option(
            None, "--draft-vocab", help="propose only the K tokens most frequent in the training data "
                                        "(own head rows + d2t: a cheaper draft step, still lossless)"),
        import_tokens: Optional[Path] = typer.Option(None, "--import-tokens", help="token data harvested elsewhere "
                                                     "(gpu-harvest-tokens.npz): features are recomputed here"),
        init_drafter: Optional[Path] = typer.Option(None, "--init-drafter", help="start from this drafter GGUF's "
                                                    "weights (e.g. trained on a GPU) and keep training"),
        adapt: Optional[Path] = typer.Option(None, "--adapt", help="continue -md's drafter on the requests recorded "
                                             "in this folder (serve --learn), within --max-minutes (default 20); "
                                             "writes the checkpoint with the best τ on held-back requests among "
                                             "those that hold the general and the everyday set (--general-drop), and "
                                             "nothing if none "
                                             "of them beats -md"),
        model_draft: Optional[Path] = typer.Option(None, "-md", "--model-draft", help="with --adapt: the drafter "
                                                   "to continue (never overwritten)"),
        replay: float = typer.Option(1.0, "--replay", help="with --adapt: sequences of the drafter's original "
                                     "training distribution mixed in per recorded request"),
        eval_prompts: int = typer.Option(10, "--eval-prompts", help="with --adapt: prompts per category of the "
                                         "general set τ is measured on before, at every checkpoint and after, "
                                         "each from a family the replay leaves out (the everyday set: as many "
                                         "everyday requests and as many story problems; 0: neither)"),
        general_drop: float = typer.Option(0.05, "--general-drop", help="with --adapt: keep only checkpoints whose "
                                           "τ fell by at most this much from -md's on the general and on the everyday "
                                           "set, one standard error of the fall included, and on each category of "
                                           "the general set"),
        blends: str = typer.Option(",".join(f"{x:g}" for x in BLENDS), "--blends", help="with --adapt: when the last "
                                   "checkpoint lost more than --general-drop, blends of it with -md are measured too, "
                                   "bisecting these shares of it for the largest that holds (none: never)"),
        threads: int = typer.Option(0, "-t", "--threads", help="CPU threads for harvest and training (0: all)"),
        chat_template: Optional[str] = chat_template_option(),
        force: bool = typer.Option(False, "--force", help="overwrite -o; with --adapt, also write the best "
                                   "checkpoint when none beats -md on the held-back requests while holding the "
                                   "general set"),
    ):
        """Generate training data with the target itself, train the drafter, export a validated GGUF."""
        given = dict(locals())                  # the first statement: exactly the options above
        from .options import resolved, validate
        from .run import run, run_adapt
        if adapt is not None:
            record, work = run_adapt(validate(resolved(given)))
            b, a, kept = record["tau_before"], record["tau_after"], record["kept"]
            kept_as = "the checkpoint" if kept.get("blend") is None else f"a blend of {kept['blend']:g} of the one"
            typer.echo(f"{out}: τ on {record['held_back_measured']} held-back recorded requests "
                       f"{b['held_back']:.2f} → {a['held_back']:.2f}; on the general set {b['general']:.2f} → "
                       f"{a['general'] if a['general'] is None else round(a['general'], 2)}, on the everyday set "
                       f"{b['everyday']:.2f} → {a['everyday'] if a['everyday'] is None else round(a['everyday'], 2)} "
                       f"(kept: the best of {len(record['checkpoints'])} checkpoints and blends within "
                       f"--general-drop {record['general_drop']:g}: {kept_as} after {kept['train_minutes']:.1f} "
                       f"training minutes; {record['recorded_train']} recorded + {record['replayed']} replayed "
                       f"sequences, {record['labelled_rows']:,} labelled rows, {record['minutes']} min); "
                       f"work dir: {work} (--resume {work})")
            return
        record, work = run(validate(resolved(given)))
        typer.echo(f"{out}: validation τ estimate {record['val_tau_estimate']:.2f} "
                   f"(slot acceptance {', '.join(f'{x:.2f}' for x in record['val_slot_accept'])}); "
                   f"{record['labelled_rows']:,} labelled rows at {record['rows_per_second']:.0f} rows/s "
                   f"({record['precision']}); checkpoint: {work} (--resume {work})")
