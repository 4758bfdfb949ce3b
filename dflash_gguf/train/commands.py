"""`dflash-gguf train`: distil a DFlash drafter for a GGUF target."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..engine_options import chat_template_option
from ..errors import UserError


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        model: Path = typer.Option(..., "-m", "--model", help="target GGUF (the teacher)"),
        out: Path = typer.Option(..., "-o", "--out", help="drafter GGUF to write"),
        prompts: list[Path] = typer.Option([], "--prompts", help="JSONL files (.gz too) with a 'prompt' field "
                                           "(default: the shipped licensed prompt set)"),
        layers: int = typer.Option(2, "--layers", help="draft layers"),
        block_size: int = typer.Option(8, "--block-size"),
        taps: str = typer.Option("auto", "--taps", help="auto | comma-separated target layer ids"),
        tokens: Optional[int] = typer.Option(300_000, "--tokens", help="tokens of training text the dataset holds "
                                             "(the harvest stops there; 0: every prompt)"),
        harvest_minutes: Optional[float] = typer.Option(None, "--harvest-minutes",
                                                        help="stop harvesting after this long (resumable)"),
        parallel: int = typer.Option(8, "--parallel", help="sequences generated together while harvesting"),
        harvest_processes: int = typer.Option(1, "--harvest-processes", help="harvest in N processes side by "
                                              "side (with -t 1: faster than one N-threaded one on a busy CPU)"),
        rows: Optional[int] = typer.Option(None, "--rows", help="labelled block rows to train on (the schedule "
                                           "runs over them; default: --epochs over the data)"),
        epochs: float = typer.Option(2.0, "--epochs"),
        max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="stop training after this long "
                                                    "(resume later with --resume)"),
        schedule_minutes: Optional[float] = typer.Option(None, "--schedule-minutes", help="a time-boxed run: "
                                                         "warm-up and cosine over this many minutes of training, "
                                                         "which then ends (instead of over --rows)"),
        lr: float = typer.Option(8e-4, "--lr"),
        distill: float = typer.Option(0.0, "--distill", help="share of the loss against the target's top-k "
                                      "probabilities kept at harvest time (0: hard labels only)"),
        tv: Optional[float] = typer.Option(None, "--tv", help="share of the loss that is the total variation to "
                                           "the target's top-k probabilities (1 - the chance a drafted token is "
                                           "accepted); default 0.9, or 0 with --distill (docs/training-ab.md)"),
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
                                                "cache, keyed by target sha256 + prompt set + seed)"),
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
        threads: int = typer.Option(0, "-t", "--threads", help="CPU threads for harvest and training (0: all)"),
        chat_template: Optional[str] = chat_template_option(),
        force: bool = typer.Option(False, "--force"),
    ):
        """Generate training data with the target itself, train the drafter, export a validated GGUF."""
        if tv is None:
            tv = 0.9 if distill == 0 else 0.0
        if not 0.0 <= tv <= 1.0 or distill + tv > 1.0:
            raise UserError(f"--tv {tv}: choose a share between 0 and 1 that, with --distill {distill}, "
                            "adds up to at most 1")
        if supervised_slots is not None and not 1 <= supervised_slots < block_size:
            raise UserError(f"--supervised-slots {supervised_slots}: choose 1..{block_size - 1} "
                            f"(block size {block_size})")
        if markov_rank < 0:
            raise UserError(f"--markov-rank {markov_rank}: choose 0 (no Markov head) or a rank of at least 1 "
                            "(e.g. 64; a multiple of 32 keeps W1 in Q8_0)")
        if harvest_processes < 1:
            raise UserError(f"--harvest-processes {harvest_processes}: must be >= 1")
        if confidence_head and not markov_rank:
            raise UserError("--confidence-head reads the Markov head's W1: add --markov-rank R (e.g. 64)")
        from ..engine.session import require_native
        from ..gguf_check import check_target
        check_target(model)            # the shared validation, before torch loads or llama.cpp sees the file
        from ..corpus.prompts import DEFAULT_PROMPTS, load
        from ..native.build import sha256_file
        from ..paths import cache_root
        from .harvest import HarvestSettings
        from .pipeline import dataset_dir, parse_taps, prompts_sha256, train_drafter
        from ..convert.target_info import read_target
        from .trainer import TrainSettings
        try:
            import torch
        except ImportError:
            raise UserError("training needs PyTorch: pip install 'dflash-gguf[train]' (torch==2.13.0)") from None
        if device not in ("cpu", "cuda"):
            raise UserError(f"--device {device!r}: use cpu or cuda")
        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
        if precision not in ("auto", "fp32", "bf16"):
            raise UserError(f"--precision {precision!r}: use auto, fp32 or bf16")
        if not 0.0 <= distill <= 1.0:
            raise UserError(f"--distill {distill}: choose a share between 0 and 1")
        if not 0.0 <= short_blocks <= 1.0:
            raise UserError(f"--short-blocks {short_blocks}: choose a share between 0 and 1")
        require_native()
        if not model.is_file():
            raise UserError(f"-m {model}: no such file")
        rows_in = [r for p in (prompts or [DEFAULT_PROMPTS]) for r in load(p)]
        if not rows_in:
            raise UserError("no training prompts")
        if resume is not None and not (resume / "checkpoint" / "ckpt.pt").is_file():
            raise UserError(f"--resume {resume}: no checkpoint there (expected {resume}/checkpoint/ckpt.pt)")
        try:
            target_info = read_target(model)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - any parse failure means the same thing to the user
            raise UserError(f"-m {model}: not a readable GGUF target ({type(e).__name__}: {e})") from None
        tap_ids = parse_taps(taps, target_info.n_layer)
        from ..textgen.chat import read_choice
        template_choice = read_choice(chat_template)
        data = data_dir or dataset_dir(sha256_file(model), prompts_sha256(rows_in), seed)
        if init_drafter is not None and not init_drafter.is_file():
            raise UserError(f"--init-drafter {init_drafter}: no such file")
        if import_tokens is not None:
            if not import_tokens.is_file():
                raise UserError(f"--import-tokens {import_tokens}: no such file")
            data = data.with_name(data.name + "-imported")
        work = resume or work_dir or cache_root() / "train" / f"{out.stem}-{data.name}"
        if out.exists() and not force:
            raise UserError(f"{out} exists; pass --force to overwrite it")
        from .preflight import dataset_feature_dtype, run_checks
        ngl = n_gpu_layers if n_gpu_layers is not None else (999 if device == "cuda" else 0)
        checked = run_checks(model, target_info, rows_in, tap_ids, n_layers=layers, block_size=block_size,
                             draft_vocab=draft_vocab, chat_template=template_choice, data_dir=data,
                             max_tokens=tokens or None, top_k_probs=0 if import_tokens else 8,
                             n_threads=threads, n_gpu_layers=ngl)
        feature_dtype = dataset_feature_dtype(data, checked.feature_dtype)
        if import_tokens is not None:
            from .refeature import import_tokens as rebuild
            rebuild(import_tokens, model, data, n_threads=threads, feature_dtype=feature_dtype)
        if loss_vocab_extra is None:
            loss_vocab_extra = 2048 if device == "cpu" else -1
        if threads:
            torch.set_num_threads(threads)
        settings = TrainSettings(n_layers=layers, block_size=block_size, epochs=epochs, rows=rows, lr=lr,
                                 device=device, seed=seed, precision=precision, distill=distill,
                                 tv=tv, cut_at_first_error=cut_at_first_error,
                                 supervised_slots=supervised_slots, short_blocks=short_blocks,
                                 markov_rank=markov_rank, confidence_head=confidence_head,
                                 max_seconds=max_minutes * 60 if max_minutes else None,
                                 schedule_seconds=schedule_minutes * 60 if schedule_minutes else None,
                                 loss_vocab_extra=None if loss_vocab_extra < 0 else loss_vocab_extra)
        harvest_settings = HarvestSettings(taps=tap_ids, seed=seed, n_threads=threads, n_parallel=parallel,
                                           processes=harvest_processes,
                                           n_gpu_layers=ngl, top_k_probs=0 if import_tokens else 8,
                                           feature_dtype=feature_dtype,
                                           chat_template=checked.template.text if checked.template else None)
        record = train_drafter(model, out, rows_in, work, taps=tap_ids, harvest_settings=harvest_settings,
                               train_settings=settings, max_tokens=tokens or None, outtype=outtype,
                               resume=resume is not None, force=force,
                               data_note=", ".join(str(p) for p in (prompts or [DEFAULT_PROMPTS])),
                               draft_vocab=draft_vocab, data_dir=data,
                               harvest_seconds=harvest_minutes * 60 if harvest_minutes else None,
                               init_drafter=init_drafter,
                               chat_template_source=checked.template.source if checked.template else None)
        typer.echo(f"{out}: validation τ estimate {record['val_tau_estimate']:.2f} "
                   f"(slot acceptance {', '.join(f'{x:.2f}' for x in record['val_slot_accept'])}); "
                   f"{record['labelled_rows']:,} labelled rows at {record['rows_per_second']:.0f} rows/s "
                   f"({record['precision']}); checkpoint: {work} (--resume {work})")
