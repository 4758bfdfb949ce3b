"""Token data without features (from the GPU machine, or kept small on purpose) -> a dataset the trainer
reads: each sequence is read once by the target in a batched prefill and its tapped features are stored.

Cheaper to keep than features (4 bytes per token instead of 2·k·H = 4,608 for SmolLM2 with 4 taps), at the
cost of one prefill pass per sequence; `lab/harvest_throughput.py --prefill` measures that pass.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..target_file import TargetFile
from .harvest import DatasetWriter


def export_tokens(data_dir: Path, out: Path) -> Path:
    """The dataset's tokens (uint16 where the vocabulary fits) and index as one compressed .npz."""
    index = (data_dir / "index.jsonl").read_text()
    rows = [json.loads(x) for x in index.splitlines() if x.strip()]
    n = rows[-1]["offset"] + rows[-1]["length"] if rows else 0
    tokens = np.fromfile(data_dir / "tokens.bin", dtype=np.int32, count=n)
    small = tokens.max(initial=0) < 65536
    meta = json.loads((data_dir / "meta.json").read_text())
    np.savez_compressed(out, tokens=tokens.astype(np.uint16 if small else np.int32), index=np.array(index),
                        meta=np.array(json.dumps(meta)))
    return out


def import_tokens(npz: Path, target: TargetFile, out_dir: Path, n_threads: int = 0, n_gpu_layers: int = 0,
                  feature_dtype: str = "float16") -> DatasetWriter:
    """Rebuild a full dataset (features by prefill, no top-k) from export_tokens' file; resumable."""
    z = np.load(npz)
    tokens = z["tokens"].astype(np.int32)
    rows = [json.loads(x) for x in str(z["index"]).splitlines() if x.strip()]
    meta = json.loads(str(z["meta"])) | {"store_features": True, "top_k_probs": 0,
                                          "features": "recomputed by a batched prefill",
                                          "feature_dtype": feature_dtype}
    writer = DatasetWriter(out_dir, meta)
    items = [(r.get("prompt_index", i), tokens[r["offset"]:r["offset"] + r["length"]].tolist(),
              r.get("spans") or [[r["response_start"], r["length"]]], r) for i, r in enumerate(rows)]
    return write_with_features(writer, target, items, n_threads=n_threads, n_gpu_layers=n_gpu_layers)


def write_with_features(writer: DatasetWriter, target: TargetFile, items, n_threads: int = 0,
                        n_gpu_layers: int = 0) -> DatasetWriter:
    """Append (prompt_index, tokens, spans, row) sequences to `writer`, each with its features from one
    batched prefill; those it holds already are skipped (resumable). Where the writer keeps the target's top-k
    (meta top_k_probs), the same pass gives it: at row p - 1 the distribution of the token at p, for the tokens
    of the spans (-1 and 0 elsewhere, as the harvest keeps them)."""
    from ..native.wrappers import Batch, Context, ContextSettings  # noqa: PLC0415
    from ..textgen.greedy import prefill_features  # noqa: PLC0415
    from .harvest import top_k_probs  # noqa: PLC0415
    k = int(writer.meta.get("top_k_probs", 0))
    items = [x for x in items if x[0] not in writer.done]
    model = target.model(n_gpu_layers)
    longest = max((len(x[1]) for x in items), default=1)
    ctx = Context(model, ContextSettings(n_ctx=max(512, longest), n_batch=512, n_ubatch=512, n_threads=n_threads))
    batch = Batch(model.native, 512)
    t0 = time.time()
    try:
        for pi, seq, spans, row in items:
            ids = np.full((len(seq), k), -1, np.int32) if k else None
            probs = np.zeros((len(seq), k), np.float32) if k else None
            labelled = np.zeros(len(seq), bool)
            for a, b in spans:
                labelled[max(a - 1, 0):b - 1] = True

            def keep_top_k(positions, logits):
                ids[positions], probs[positions] = top_k_probs(np.asarray(logits, np.float32), k)
            feats = prefill_features(ctx, batch, writer.meta["taps"], seq, labelled if k else None, keep_top_k)
            feats[-1] = 0                      # the last token was never decoded during generation
            writer.add(seq, spans, row, prompt_index=pi, sampled=bool(row.get("sampled")), feats=feats,
                       topk_ids=ids, topk_p=probs)
    finally:
        batch.close()
        ctx.close()
    writer.seconds = time.time() - t0
    return writer
