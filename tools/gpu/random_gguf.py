#!/usr/bin/env python3
"""Random-weight GGUFs of a real model's shape, for timing only (GPU check: the 8B verify curve, MoE offload).

gguf-py writes an F16 file whose tensors are views of one tiled random block (seconds even for 8B
parameters), then llama_model_quantize turns it into the requested type and the F16 file is deleted. The types
llama.cpp writes only with an importance matrix (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS) are written directly instead: every
matrix of a layer quantized by ggml with a flat importance matrix, the output head Q6_K, the token embedding Q8_0.
The vocabulary is convert/synthetic's (made-up words plus the 256 byte tokens), so any text tokenizes.
A file already written for the same spec is reused (`<out>.json` records the spec).

    python tools/gpu/random_gguf.py --shape qwen3-8b --ftype q4_k_m -o /big/disk/qwen3-8b-random.gguf
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

# name -> geometry; the MoE one is Qwen3-30B-A3B's layer with fewer layers (a 48-layer F16 source would not fit
# the machine's disk next to its quantized copy)
SHAPES = {
    "qwen3-8b": dict(arch="qwen3", n_embd=4096, n_layer=36, n_head=32, n_head_kv=8, head_dim=128, n_ff=12288,
                     n_vocab=151936),
    "qwen3-2b": dict(arch="qwen3", n_embd=2048, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=6144,
                     n_vocab=151936),
    "qwen3-moe": dict(arch="qwen3moe", n_embd=2048, n_layer=8, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144,
                      n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=151936),
    "smollm2-135m": dict(arch="qwen3", n_embd=576, n_layer=30, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536,
                         n_vocab=49152),     # SmolLM2-135M's geometry (tools/gpu/shape_probe.py)
    "tiny-dense": dict(arch="qwen3", n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                       n_vocab=2048),
    "tiny-moe": dict(arch="qwen3moe", n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                     n_expert=8, n_expert_used=2, n_ff_exp=256, n_vocab=2048),
}
BLOCK_ELEMENTS = 1 << 24      # the random block every tensor is cut from (32 MiB of F16)


def tensor_shapes(g: dict) -> dict[str, tuple[int, ...]]:
    """name -> numpy shape ([out, in], ggml's ne reversed)."""
    e, hd = g["n_embd"], g["head_dim"]
    out = {"token_embd.weight": (g["n_vocab"], e), "output_norm.weight": (e,), "output.weight": (g["n_vocab"], e)}
    for i in range(g["n_layer"]):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": (e,), b + "attn_q.weight": (g["n_head"] * hd, e),
                b + "attn_k.weight": (g["n_head_kv"] * hd, e), b + "attn_v.weight": (g["n_head_kv"] * hd, e),
                b + "attn_output.weight": (e, g["n_head"] * hd), b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,), b + "ffn_norm.weight": (e,)}
        if g["arch"] == "qwen3moe":
            n_x, f = g["n_expert"], g["n_ff_exp"]
            out |= {b + "ffn_gate_inp.weight": (n_x, e), b + "ffn_gate_exps.weight": (n_x, f, e),
                    b + "ffn_up_exps.weight": (n_x, f, e), b + "ffn_down_exps.weight": (n_x, e, f)}
        else:
            out |= {b + "ffn_gate.weight": (g["n_ff"], e), b + "ffn_up.weight": (g["n_ff"], e),
                    b + "ffn_down.weight": (e, g["n_ff"])}
    return out


# ftype -> (ggml type id, llama.cpp's file type) of the types written without llama_model_quantize (the docstring)
DIRECT = {"iq2_xxs": (16, 19), "iq2_xs": (17, 20), "iq1_s": (19, 24), "iq1_m": (29, 31)}
_Q8_0, _Q6_K = 8, 14


def write_gguf(path: Path, g: dict, seed: int = 0, ftype: str = "f16") -> int:
    """Write the F16 GGUF, or with a DIRECT ftype its matrices quantized by ggml as they are added; returns the number
    of parameters."""
    import gguf

    from lab.synthetic import add_synthetic_vocab
    from dflash_gguf.convert.writer import add_decoder_hparams, finish
    from dflash_gguf.native.quantize import quantize_rows

    arch = g["arch"]
    w = gguf.GGUFWriter(str(path), arch)
    add_decoder_hparams(w, n_layer=g["n_layer"], n_ctx=32768, n_embd=g["n_embd"], n_ff=g["n_ff"], n_head=g["n_head"],
                        n_head_kv=g["n_head_kv"], head_dim=g["head_dim"], rms_eps=1e-6, rope_base=1000000.0)
    w.add_file_type(DIRECT[ftype][1] if ftype in DIRECT else 1)
    if arch == "qwen3moe":
        w.add_expert_count(g["n_expert"])
        w.add_expert_used_count(g["n_expert_used"])
        w.add_expert_feed_forward_length(g["n_ff_exp"])
    add_synthetic_vocab(w, g["n_vocab"] - 256 - 3, byte_tokens=True)

    shapes = tensor_shapes(g)
    biggest = max(int(np.prod(s)) for s in shapes.values())
    rng = np.random.default_rng(seed)
    block = (rng.standard_normal(min(BLOCK_ELEMENTS, biggest), dtype=np.float32) * 0.02).astype(np.float16)
    pool = np.tile(block, -(-biggest // block.size))[:biggest]       # every weight is a view of this
    ones = np.ones(max(s[0] for s in shapes.values() if len(s) == 1), dtype=np.float32)
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        if len(shape) == 1:
            w.add_tensor(name, ones[:n])
        elif ftype not in DIRECT:
            w.add_tensor(name, pool[:n].reshape(shape))
        else:
            kind = _Q8_0 if name == "token_embd.weight" else _Q6_K if name == "output.weight" else DIRECT[ftype][0]
            raw = quantize_rows(kind, pool[:n].reshape(-1, shape[-1]))
            w.add_tensor(name, raw.reshape(*shape[:-1], raw.shape[-1]), raw_dtype=gguf.GGMLQuantizationType(kind))
    finish(w)
    return sum(int(np.prod(s)) for s in shapes.values())


def make(shape: str, ftype: str, out: Path, seed: int = 0) -> dict:
    """The quantized random GGUF at `out` (reused when its spec matches); a JSON-able description."""
    from dflash_gguf.native.quantize import llama_quantize

    g = SHAPES[shape]
    spec = {"shape": shape, "geometry": g, "ftype": ftype, "seed": seed}
    meta = out.with_name(out.name + ".json")
    if out.is_file() and meta.is_file() and json.loads(meta.read_text()).get("spec") == spec:
        return json.loads(meta.read_text()) | {"reused": True}
    out.parent.mkdir(parents=True, exist_ok=True)
    f16 = out.with_name(out.name + ".f16.gguf") if ftype != "f16" else out
    t0 = time.perf_counter()
    if ftype in DIRECT:
        tmp = out.with_name(f".{out.name}.direct")
        n_params = write_gguf(tmp, g, seed, ftype)
        tmp.replace(out)
    else:
        n_params = write_gguf(f16, g, seed)
    t_write = time.perf_counter() - t0
    t_quant = 0.0
    if ftype != "f16" and ftype not in DIRECT:
        t0 = time.perf_counter()
        llama_quantize(f16, out, ftype)
        t_quant = time.perf_counter() - t0
        f16.unlink()
    desc = {"spec": spec, "path": str(out), "n_params": n_params, "bytes": out.stat().st_size,
            "write_s": round(t_write, 1), "quantize_s": round(t_quant, 1)}
    meta.write_text(json.dumps(desc))
    return desc | {"reused": False}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--ftype", default="q4_k_m", help="llama_model_quantize type (f16: no quantization)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args(argv)
    print(json.dumps(make(a.shape, a.ftype, a.out, a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
