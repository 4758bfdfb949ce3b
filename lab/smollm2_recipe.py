"""The recipe of the drafter shipped for the embedded default (SmolLM2-135M-Instruct Q4_1, 30 layers), shared by
lab/train_default_drafter.py (CPU), tools/gpu/train_job.py (GPU) and the tools that probe the recipe."""

from __future__ import annotations

from dflash_gguf.train.harvest import HarvestSettings

SEED = 1
TAPS = [2, 11, 19, 28]             # official formula for 4 taps over 30 layers ([1, 10, 18, 27]) + 1
MAX_NEW = {"code": 128, "math": 160, "chat": 160}    # the evaluation horizon is 128 tokens
TOP_K_PROBS = 8                    # the target's top-8 probabilities kept per position (distillation)
DRAFT_VOCAB = 4096                 # the drafter's LM head keeps the 4096 tokens SmolLM2 wrote most
N_LAYERS = 2
BLOCK_SIZE = 8


def harvest_settings(max_new: int | None = None, **settings) -> HarvestSettings:
    """The recipe's harvest; `max_new`: one response length for every category instead of MAX_NEW."""
    return HarvestSettings(taps=TAPS, seed=SEED, top_k_probs=TOP_K_PROBS,
                           max_new={c: max_new or n for c, n in MAX_NEW.items()}, **settings)
