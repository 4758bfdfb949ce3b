"""`--fit`: choose -ngl and --n-cpu-moe from free VRAM, counting the drafter and both KV caches.

Sizes come from the GGUF headers (tensor byte sizes), KV from the attention geometry; nothing is
loaded. The plan prefers, in order: everything on the GPU; routed experts of the first N layers
on the CPU (MoE: the dense part and attention stay on the GPU, which keeps verify cheap); fewer
GPU layers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import KV_CACHE_TYPES

EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(up|down|gate|gate_up)_(ch|)exps")
LAYER_RE = re.compile(r"^blk\.(\d+)\.")
MIB = 1 << 20


@dataclass
class ModelSizes:
    n_layer: int
    layer_bytes: list[int]           # non-expert bytes per layer
    expert_bytes: list[int]          # routed-expert bytes per layer
    output_bytes: int                # output head + final norm (on the GPU when ngl > n_layer)
    kv_bytes_per_token: int          # all attention layers, K+V, in the -ctk / -ctv types

    @property
    def total(self) -> int:
        return sum(self.layer_bytes) + sum(self.expert_bytes) + self.output_bytes


@dataclass
class FitPlan:
    n_gpu_layers: int
    n_cpu_moe: int
    gpu_bytes: int
    free_bytes: int
    margin_bytes: int

    def describe(self) -> str:
        moe = f", experts of the first {self.n_cpu_moe} layers on CPU" if self.n_cpu_moe else ""
        return (f"fit: -ngl {self.n_gpu_layers}{moe}: {self.gpu_bytes / MIB:.0f} MiB on the GPU of "
                f"{self.free_bytes / MIB:.0f} MiB free (margin {self.margin_bytes / MIB:.0f} MiB)")


def read_sizes(path: Path, n_ctx: int, cache_type_k: str = "f16", cache_type_v: str = "f16") -> ModelSizes:
    from ..gguf_check import parse_header  # noqa: PLC0415

    h = parse_header(path)            # validated: tensor byte sizes known, nothing loaded
    arch = h.arch

    def key(name, default=None):
        return h.value(f"{arch}.{name}", default)

    n_layer = int(key("block_count"))
    layer, expert = [0] * n_layer, [0] * n_layer
    output = 0
    for t in h.tensors:
        n = t.nbytes
        if (m := EXPERT_RE.match(t.name)) is not None and int(m.group(1)) < n_layer:
            expert[int(m.group(1))] += n
        elif (m := LAYER_RE.match(t.name)) is not None and int(m.group(1)) < n_layer:
            layer[int(m.group(1))] += n
        elif t.name.startswith(("output", "fc.", "enc.")):
            output += n
    n_embd = int(key("embedding_length"))
    n_head = key("attention.head_count", 1)
    n_head = max(max(n_head) if isinstance(n_head, list) else int(n_head), 1)
    kv_heads = key("attention.head_count_kv", n_head)
    kv_heads = max(kv_heads) if isinstance(kv_heads, list) else int(kv_heads)
    head_k = int(key("attention.key_length", n_embd // n_head))
    head_v = int(key("attention.value_length", head_k))
    kv_per_token = round(n_layer * kv_heads * (head_k * KV_CACHE_TYPES[cache_type_k]
                                                + head_v * KV_CACHE_TYPES[cache_type_v]))
    return ModelSizes(n_layer, layer, expert, output, kv_per_token)


def plan_fit(target: ModelSizes, drafter: ModelSizes | None, n_ctx: int, draft_ctx: int | None,
             free_bytes: int, margin_bytes: int = 768 * MIB, compute_bytes: int = 512 * MIB) -> FitPlan:
    """The first placement that fits: all on GPU → experts of layers 0..N-1 on CPU → fewer GPU layers."""
    fixed = compute_bytes + margin_bytes
    if drafter is not None:   # the drafter runs entirely on the GPU: weights + its (windowed) KV
        fixed += drafter.total + drafter.kv_bytes_per_token * (draft_ctx or n_ctx)
    budget = free_bytes - fixed

    def gpu_bytes(ngl: int, n_cpu_moe: int) -> int:
        on_gpu = range(max(target.n_layer - ngl, 0) if ngl <= target.n_layer else 0, target.n_layer)
        total = sum(target.layer_bytes[i] + target.kv_bytes_per_token // target.n_layer * n_ctx for i in on_gpu)
        total += sum(target.expert_bytes[i] for i in on_gpu if i >= n_cpu_moe)
        return total + (target.output_bytes if ngl > target.n_layer else 0)

    full = target.n_layer + 1
    for n_cpu_moe in range(0, target.n_layer + 1 if any(target.expert_bytes) else 1):
        if gpu_bytes(full, n_cpu_moe) <= budget:
            return FitPlan(full, n_cpu_moe, gpu_bytes(full, n_cpu_moe) + fixed - margin_bytes, free_bytes, margin_bytes)
    n_cpu_moe = target.n_layer if any(target.expert_bytes) else 0
    for ngl in range(target.n_layer, -1, -1):
        if gpu_bytes(ngl, n_cpu_moe) <= budget:
            return FitPlan(ngl, n_cpu_moe, gpu_bytes(ngl, n_cpu_moe) + fixed - margin_bytes, free_bytes, margin_bytes)
    raise UserError(f"--fit: not even the drafter and compute buffers fit in {free_bytes / MIB:.0f} MiB of free VRAM; "
                    "run on the CPU (-ngl 0) or use a smaller drafter / --draft-ctx")
