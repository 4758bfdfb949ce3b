"""`dflash-gguf train`: distil a DFlash drafter for a GGUF target."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UserError

DEFAULT_PROMPTS = Path(__file__).resolve().parent / "data" / "prompts.jsonl"


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        model: Path = typer.Option(..., "-m", "--model", help="target GGUF (the teacher)"),
        out: Path = typer.Option(..., "-o", "--out", help="drafter GGUF to write"),
        prompts: list[Path] = typer.Option([], "--prompts", help="JSONL files with a 'prompt' field "
                                           "(default: the shipped licensed prompt set)"),
        layers: int = typer.Option(2, "--layers", help="draft layers"),
        block_size: int = typer.Option(8, "--block-size"),
        taps: str = typer.Option("auto", "--taps", help="auto | comma-separated target layer ids"),
        tokens: Optional[int] = typer.Option(300_000, "--tokens", help="tokens of training text to generate"),
        epochs: float = typer.Option(2.0, "--epochs"),
        max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="stop training after this long"),
        lr: float = typer.Option(6e-4, "--lr"),
        loss_vocab_extra: Optional[int] = typer.Option(
            None, "--loss-vocab-extra", help="softmax over the data's tokens plus N random others per step; "
            "-1: the whole vocabulary (default: 2048 on cpu, the whole vocabulary on cuda)"),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
        outtype: str = typer.Option("q8_0", "--outtype"),
        work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="data + checkpoints (default: beside -o)"),
        resume: Optional[Path] = typer.Option(None, "--resume", help="continue harvesting/training in this work dir"),
        seed: int = typer.Option(0, "--seed"),
        draft_vocab: Optional[int] = typer.Option(
            None, "--draft-vocab", help="propose only the K tokens most frequent in the training data "
                                        "(own head rows + d2t: a cheaper draft step, still lossless)"),
        threads: int = typer.Option(0, "-t", "--threads"),
        force: bool = typer.Option(False, "--force"),
    ):
        """Generate training data with the target itself, train the drafter, export a validated GGUF."""
        from ..engine.session import require_native
        from ..gguf_check import check_target
        check_target(model)            # the shared validation, before torch loads or llama.cpp sees the file
        from .harvest import HarvestSettings
        from .pipeline import parse_taps, train_drafter
        from .prompts import load
        from .target_weights import attention_geometry
        from .trainer import TrainSettings
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UserError("training needs PyTorch: pip install 'dflash-gguf[train]' (torch==2.13.0)") from None
        require_native()
        if not model.is_file():
            raise UserError(f"-m {model}: no such file")
        rows = [r for p in (prompts or [DEFAULT_PROMPTS]) for r in load(p)]
        if not rows:
            raise UserError("no training prompts")
        if resume is not None and not (resume / "data" / "index.jsonl").is_file():
            raise UserError(f"--resume {resume}: no training data there (expected {resume}/data/index.jsonl)")
        try:
            geometry = attention_geometry(model)
        except Exception as e:  # noqa: BLE001 - any parse failure means the same thing to the user
            raise UserError(f"-m {model}: not a readable GGUF target ({type(e).__name__}: {e})") from None
        tap_ids = parse_taps(taps, geometry["n_layer"])
        work = resume or work_dir or out.with_suffix(".train")
        if loss_vocab_extra is None:
            loss_vocab_extra = 2048 if device == "cpu" else -1
        settings = TrainSettings(n_layers=layers, block_size=block_size, epochs=epochs, lr=lr, device=device,
                                 seed=seed, max_seconds=max_minutes * 60 if max_minutes else None,
                                 loss_vocab_extra=None if loss_vocab_extra < 0 else loss_vocab_extra)
        record = train_drafter(model, out, rows, work, taps=tap_ids,
                               harvest_settings=HarvestSettings(taps=tap_ids, seed=seed, n_threads=threads),
                               train_settings=settings, max_tokens=tokens, outtype=outtype, resume=resume is not None,
                               force=force, data_note=", ".join(str(p) for p in (prompts or [DEFAULT_PROMPTS])),
                               draft_vocab=draft_vocab)
        typer.echo(f"{out}: validation τ estimate {record['val_tau_estimate']:.2f} "
                   f"(slot acceptance {', '.join(f'{x:.2f}' for x in record['val_slot_accept'])})")
