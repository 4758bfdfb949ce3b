"""`dflash-gguf convert` and `dflash-gguf inspect`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def convert(
        src: str = typer.Argument(..., help="z-lab folder, Hugging Face repo id, or a drafter GGUF of any flavour"),
        target: Path = typer.Option(..., "--target", help="the target GGUF the drafter is for"),
        out: Path = typer.Option(..., "-o", "--out", help="output GGUF"),
        outtype: str = typer.Option("f16", "--outtype", help="f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k"),
        block_size: Optional[int] = typer.Option(None, "--block-size", help="override the block size"),
        force: bool = typer.Option(False, "--force", help="overwrite the output"),
        draft_vocab: Optional[int] = typer.Option(
            None, "--draft-vocab", help="propose only the K tokens the target writes most (own head rows + d2t); "
                                        "cuts the drafter's LM-head cost, stays lossless"),
        vocab_prompts: list[Path] = typer.Option(
            [], "--vocab-prompts", help="JSONL prompts the target answers to count tokens (default: ours)"),
        vocab_samples: int = typer.Option(200, "--vocab-samples", help="prompts the target answers (128 tokens each)"),
        vocab_seconds: Optional[float] = typer.Option(None, "--vocab-seconds", help="stop counting after this long"),
        threads: int = typer.Option(0, "-t", "--threads"),
    ):
        """Normalise a DFlash drafter into one validated upstream `dflash` GGUF for TARGET."""
        from ..target_file import TargetFile
        from .checks import fit_warnings
        from .checkpoint_formats import read_source
        from .writer import ConvertError, write_dflash_gguf
        if out.exists() and not force:       # before reading a possibly large source
            raise ConvertError(f"{out} exists; pass --force to overwrite it")
        with TargetFile.open(target) as target_file:
            source = read_source(src, target_file, block_size)
            for note in source.notes:
                print(f"note: {note}", file=sys.stderr)
            for warning in fit_warnings(source.config, target_file, source.trained_for, source.num_target_layers):
                print(f"warning: {warning}: it may have been trained for another target (low acceptance)",
                      file=sys.stderr)
            vocab = source.draft_vocab
            if draft_vocab is not None:
                from ..drafter.draft_vocab import counted
                vocab = counted(target_file, draft_vocab, vocab_prompts, vocab_samples, vocab_seconds, threads)
            write_dflash_gguf(source.tensors, source.config, target_file, out, outtype=outtype, force=force,
                              name=f"{target_file.name} {source.config.family} drafter", source=source.description,
                              extra_metadata={**source.train_metadata,
                                              "dflash_gguf.converted_from": source.description}, draft_vocab=vocab)
        typer.echo(out)

    @app.command()
    def inspect(
        file: Path = typer.Argument(..., help="drafter GGUF"),
        target: Optional[Path] = typer.Option(None, "--target", help="check whether it fits this target"),
        as_json: bool = typer.Option(False, "--json"),
    ):
        """Geometry, target layers, block size, mask token, training metadata and fit of a drafter."""
        from .inspect_drafter import inspect_drafter
        report = inspect_drafter(file, target)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
            return
        for key, value in report.items():
            if key == "training":
                for k, v in value.items():
                    typer.echo(f"{'train.' + k:>24}: {v}")
            elif isinstance(value, list) and key in ("notes", "warnings"):
                for line in value:
                    typer.echo(f"{key[:-1]:>24}: {line}")
            elif value is not None:
                typer.echo(f"{key:>24}: {value}")
