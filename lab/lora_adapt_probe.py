#!/usr/bin/env python3
"""Does a low-rank update forget less than continuing every weight? `train --adapt` with LoRA, a probe.

Continuing the whole drafter on one persona's requests lifts unseen τ of the persona past +0.25 only when it also
costs ../shared/prompts more than 0.05 (docs/learning.md, "Two more personas"). This runs `dflash-gguf train
--adapt` unchanged but for what it trains: every linear map of the drafter's layers and its feature projection `fc`
keeps its weight frozen and learns W + (alpha / r) B A instead (A: r x in, B: out x r, B started at zero, so the
start is the drafter given), the norms frozen too; each checkpoint is exported with B A merged into W, so the files
are ordinary drafters and `train --adapt` measures and chooses among them as always. Nothing here changes the
product. Then measure it with lab/learn_harness.py on the same work dir (it skips adapting when the work dir's
adapt-record.json exists):

  .venv/bin/python lab/lora_adapt_probe.py --rank 16 --lr 1e-3 -- <train --adapt arguments>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def lora_linear(linear, rank: int, alpha: float):
    import torch
    from torch import nn

    class LoRALinear(nn.Module):
        """linear's frozen weight plus (alpha / rank) B A; state_dict keeps `weight` under the same name."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(linear.weight.detach().clone(), requires_grad=False)
            n_out, n_in = self.weight.shape
            self.lora_a = nn.Parameter(torch.randn(rank, n_in) / n_in ** 0.5)
            self.lora_b = nn.Parameter(torch.zeros(n_out, rank))
            self.scale = alpha / rank

        def forward(self, x):
            return nn.functional.linear(x, self.weight) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale

        def merged(self):
            return self.weight + self.scale * (self.lora_b @ self.lora_a)
    return LoRALinear()


def with_lora(trainer, rank: int, alpha: float) -> list[str]:
    """trainer's drafter with LoRA on every linear map of its layers and on fc, everything else frozen; its optimizer
    over the low-rank factors alone. Returns the wrapped modules' names."""
    import torch
    from torch import nn
    for p in trainer.model.parameters():
        p.requires_grad_(False)
    wrapped = []
    for name, module in list(trainer.model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and (full == "fc" or full.startswith("layers.")):
                setattr(module, child_name, lora_linear(child, rank, alpha))
                wrapped.append(full)
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.opt = torch.optim.AdamW(trainable, lr=trainer.s.lr, weight_decay=0.0, betas=(0.9, 0.95))
    return wrapped


def patch(rank: int, alpha: float) -> None:
    from dflash_gguf.train import adapt as adapt_module
    from dflash_gguf.train.trainer import Trainer
    original = adapt_module.continued_trainer

    def continued_trainer(*args, **kwargs):
        trainer = original(*args, **kwargs)
        names = with_lora(trainer, rank, alpha)
        n = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        print(f"LoRA rank {rank}, alpha {alpha} on {len(names)} linear maps: {n:,} trained parameters",
              file=sys.stderr)
        return trainer
    adapt_module.continued_trainer = continued_trainer
    state_numpy = Trainer.state_numpy

    def merged_state(self):
        out = state_numpy(self)
        for name, module in self.model.named_modules():
            if hasattr(module, "merged"):
                out[f"{name}.weight"] = module.merged().detach().float().cpu().numpy()
        return {k: v for k, v in out.items() if ".lora_" not in k}
    Trainer.state_numpy = merged_state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("adapt_args", nargs=argparse.REMAINDER, help="after --: train --adapt's arguments")
    a = ap.parse_args()
    args = a.adapt_args[1:] if a.adapt_args[:1] == ["--"] else a.adapt_args
    if "--resume" in args:
        raise SystemExit("lab/lora_adapt_probe.py: --resume cannot go on from this probe's checkpoints (they hold the "
                         "low-rank factors, which train --adapt's resume does not load); give a new --work-dir")
    patch(a.rank, a.alpha)
    from dflash_gguf.cli import main as cli_main
    cli_main(["train", "--adapt", *args])


if __name__ == "__main__":
    main()
