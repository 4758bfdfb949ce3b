"""The target in PyTorch, from its GGUF alone: weights dequantized into a transformers Llama model.

Used where llama.cpp is not built yet or a GPU should do the generating (the H100 window): the harvest then
runs batched in torch and writes the same dataset format as `harvest.py` (single-turn rows). It is not
llama.cpp: the weights are the dequantized values and activations stay in float, so logits and features
differ from llama.cpp's quantized dot products in the last digits (tests/test_torch_target.py measures how
close they are on SmolLM2). Llama-family targets only (llama, mistral).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from dflash_gguf.errors import UserError
from dflash_gguf.train.harvest import DatasetWriter, HarvestSettings, top_k_probs

SUPPORTED = {"llama", "mistral"}


def hf_llama_from_gguf(target: Path, device: str = "cpu", dtype: str = "float32"):
    """(transformers LlamaForCausalLM in eval mode, its target_file.TargetFile) with the GGUF's weights."""
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    from dflash_gguf.target_file import TargetFile  # noqa: PLC0415
    from dflash_gguf.train.frozen_weights import embedding_and_head, layer_init  # noqa: PLC0415
    g = TargetFile.open(target)
    if g.arch not in SUPPORTED:
        raise UserError(f"{target}: a torch target exists for {sorted(SUPPORTED)} only, not {g.arch}; "
                        "harvest with llama.cpp instead")
    embed, head = embedding_and_head(g)
    config = LlamaConfig(vocab_size=g.n_vocab, hidden_size=g.n_embd, intermediate_size=g.n_ff,
                         num_hidden_layers=g.n_layer, num_attention_heads=g.n_head,
                         num_key_value_heads=g.n_head_kv, head_dim=g.head_dim, rms_norm_eps=g.rms_eps,
                         rope_theta=g.rope_theta if g.rope_theta is not None else 10000.0, max_position_embeddings=8192,
                         tie_word_embeddings=head is embed, attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(config)
    layers = layer_init(g, 0, g.n_layer)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": head, "model.norm.weight": layers.pop("norm.weight")}
    state |= {f"model.{k}": v for k, v in layers.items()}
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.array(v, copy=True)) for k, v in state.items()},
                                                strict=False)
    if unexpected or [m for m in missing if "rotary" not in m and m != "lm_head.weight"]:
        raise UserError(f"{target}: weights do not fit a Llama model (missing {missing}, unexpected {unexpected})")
    return model.to(device=device, dtype=getattr(torch, dtype)).eval(), g


def forward_taps(model, tokens: list[int], taps: list[int], device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """(logits [n, V], features [n, k*H]) of one sequence in one pass; tap t = hidden state after t layers."""
    import torch  # noqa: PLC0415
    with torch.no_grad():
        out = model(torch.as_tensor([tokens], device=device), output_hidden_states=True)
    feats = torch.cat([out.hidden_states[t][0] for t in taps], dim=-1)
    return out.logits[0].float().cpu().numpy(), feats.float().cpu().numpy()


def pretokenize(target: Path, prompts: list[dict], out: Path) -> Path:
    """Write the prompts as the target reads them (token ids, chat template applied) plus its end-of-generation
    ids to one .npz, so a machine without llama.cpp can harvest with the torch target."""
    from dflash_gguf.native.wrappers import Model  # noqa: PLC0415
    from dflash_gguf.textgen.prompting import format_prompt  # noqa: PLC0415
    model = Model(target)
    try:
        toks = [format_prompt(model, r) for r in prompts]
        eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
    finally:
        model.close()
    lengths = np.array([len(t) for t in toks], np.int64)
    np.savez_compressed(out, tokens=np.concatenate([np.asarray(t, np.int32) for t in toks]), lengths=lengths,
                        eog=np.asarray(eog, np.int32))
    return out


def load_pretokenized(path: Path) -> tuple[list[list[int]], set[int]]:
    with np.load(path) as z:           # each z[...] decompresses the whole array again: read them once
        tokens, lengths, eog = z["tokens"], z["lengths"], z["eog"]
    ends = np.cumsum(lengths)
    return [tokens[e - n:e].tolist() for e, n in zip(ends, lengths)], set(eog.tolist())


def torch_harvest(target: Path, prompts: list[dict], prompt_tokens: list[list[int]], eog: set[int], out: Path,
                  settings: HarvestSettings, *, device: str = "cuda", dtype: str = "bfloat16",
                  max_seconds: float | None = None, meta_extra: dict | None = None) -> DatasetWriter:
    """Generate responses in groups of settings.n_parallel prompts (left-padded, one KV cache per group),
    keeping per position the tapped features and the top-K probabilities; resumes by prompt like harvest().
    prompt_tokens[i] is prompts[i] as the target reads it (see pretokenize)."""
    from dflash_gguf.engine.sampling import SamplingParams, pick  # noqa: PLC0415
    model, g = hf_llama_from_gguf(target, device, dtype)
    K, taps = settings.top_k_probs, settings.taps
    meta = {"target": target.name, "target_arch": g.arch, "taps": list(taps), "n_embd": g.n_embd,
            "seed": settings.seed, "store_features": True, "top_k_probs": K, "generator": f"torch:{device}:{dtype}",
            "settings": dict(vars(settings))} | (meta_extra or {})
    writer = DatasetWriter(out, meta)
    todo = [i for i in range(len(prompts)) if i not in writer.done]
    t0 = time.time()

    for g0 in range(0, len(todo), settings.n_parallel):
        if max_seconds is not None and time.time() - t0 >= max_seconds:
            break
        group = []
        for index in todo[g0:g0 + settings.n_parallel]:
            toks = prompt_tokens[index]
            if 4 <= len(toks) <= min(768, settings.ctx_per_seq // 2):
                rng = np.random.default_rng([settings.seed, index])
                sampled = rng.random() < settings.sampled_fraction
                sp = SamplingParams(settings.temperature, settings.top_k, settings.top_p) if sampled else SamplingParams()
                group.append((index, prompts[index], toks, sp, rng))
        if group:
            _generate_group(model, group, taps, K, settings, writer, eog, device, pick)
    writer.seconds = time.time() - t0
    return writer


def _generate_group(model, group, taps, K, settings, writer, eog, device, pick) -> None:
    import torch  # noqa: PLC0415
    from transformers import DynamicCache  # noqa: PLC0415
    n, longest = len(group), max(len(g[2]) for g in group)
    ids = torch.zeros(n, longest, dtype=torch.long, device=device)
    mask = torch.zeros(n, longest, dtype=torch.long, device=device)
    for i, (_, _, toks, _, _) in enumerate(group):              # left padding
        ids[i, longest - len(toks):] = torch.as_tensor(toks)
        mask[i, longest - len(toks):] = 1
    budget = [min(settings.max_new.get(r.get("category"), 256), settings.ctx_per_seq - len(t) - 1)
              for _, r, t, _, _ in group]
    seqs = [list(t) for _, _, t, _, _ in group]
    feats = [[] for _ in group]
    tk_ids = [[np.full(K, -1, np.int32)] * (len(t) - 1) for _, _, t, _, _ in group]
    tk_p = [[np.zeros(K, np.float32)] * (len(t) - 1) for _, _, t, _, _ in group]
    live = [True] * n
    cache = DynamicCache()
    step_ids, step_mask = ids, mask
    with torch.no_grad():
        while any(live):
            pos = (step_mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
            out = model(input_ids=step_ids, attention_mask=step_mask, position_ids=pos, past_key_values=cache,
                        use_cache=True, output_hidden_states=True)
            cache = out.past_key_values
            f = torch.cat([out.hidden_states[t] for t in taps], dim=-1).float().cpu().numpy()    # [n, s, k*H]
            logits = out.logits[:, -1].float().cpu().numpy()
            top_ids, top_p = top_k_probs(logits, K) if K else (None, None)
            nxt = []
            for i in range(n):
                if live[i]:
                    s = step_ids.shape[1]
                    real = f[i, -s:] if s == 1 else f[i, longest - len(group[i][2]):]
                    feats[i].extend(real)
                    if K:
                        tk_ids[i].append(top_ids[i])
                        tk_p[i].append(top_p[i])
                    t = pick(logits[i], group[i][3], group[i][4])
                    seqs[i].append(t)
                    if t in eog or len(seqs[i]) - len(group[i][2]) >= budget[i]:
                        live[i] = False
                        _write(writer, group[i], seqs[i], feats[i], tk_ids[i], tk_p[i], K)
                nxt.append(seqs[i][-1])
            step_ids = torch.as_tensor(nxt, device=device)[:, None]
            step_mask = torch.cat([step_mask, torch.ones(n, 1, dtype=torch.long, device=device)], dim=1)


def _write(writer, item, seq, feats, tk_ids, tk_p, K) -> None:
    index, row, prompt, sp, _ = item
    width = feats[0].shape[0]
    writer.add(seq, [[len(prompt), len(seq)]], row, prompt_index=index, sampled=not sp.greedy,
               feats=np.vstack(feats + [np.zeros(width, np.float32)]),
               topk_ids=np.vstack(tk_ids + [np.full(K, -1, np.int32)]) if K else None,
               topk_p=np.vstack(tk_p + [np.zeros(K, np.float32)]) if K else None)
