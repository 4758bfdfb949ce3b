"""DSpark draft source: DFlash plus a low-rank Markov head chained over the slots (DeepSeek DeepSpec).

Slot i's logits are the backbone's plus W2·W1[prev], where prev is the anchor token for the first slot and
the token drafted at the slot before after that. The chain runs in one of two places:
- here, in numpy (drafters on the CPU): the graph returns the backbone's logits (patches/0009) and the
  bias is one [columns, R] matrix-vector product per slot over the drafter's columns (its draft vocabulary:
  4,096 rows for our SmolLM2 drafter). llama.cpp's in-graph chain scatters each slot's bias over the whole
  vocabulary and concatenates the slots: 4x the cost of the backbone's draft on that drafter (docs/dflash-family.md).
  At T > 0 in rejection mode the chain follows the tokens the loop samples, as DeepSpec trains it
  (teacher-forced on the tokens before each slot), and returns each slot's q: verification divides by the
  distribution each token was drawn from, so the output stays the target's.
- in the graph (drafters offloaded to a GPU: src/models/dflash.cpp, build_dspark_markov_head), chained on
  argmax tokens. At T > 0 slot i's distribution then depends only on that argmax chain, not on the tokens
  the loop samples, so q_i = transform(logits_i) is what each draft is drawn from (exact, accepting less).
Both give the same greedy drafts, up to float rounding of near ties.

Block layouts (`dflash.sample_from_anchor`): anchor-first (true, DeepSpec; upstream's default when the key
is absent) reads the n drafts from rows 0..n-1 — row i predicts position pos+i+1 — so n drafts need only n
rows; bonus-anchor (false, SpecForge exports) reads rows 1..n like DFlash.
"""

from __future__ import annotations

import numpy as np

from ...gguf_check import parse_header
from ...gguf_family import DSPARK
from ...gguf_reader import open_gguf
from .base import Proposal
from .dflash import DFlashSource


class NumpyMarkovHead:
    """A DSpark GGUF's Markov and confidence heads, run in numpy: W1 [V, R] (rows dequantized when asked for),
    W2 [columns, R] and its optional scale; `columns` are the target ids of W2's rows (the draft vocabulary,
    `d2t`), None when W2 spans the vocabulary."""

    def __init__(self, path):
        import gguf  # noqa: PLC0415
        self._dequantize = gguf.quants.dequantize
        tensors = {t.name: t for t in open_gguf(path).tensors}
        self._w1 = tensors["markov_w1.weight"]
        self.rank = int(self._w1.shape[0])
        self.w2 = self._dense(tensors["markov_w2.weight"]).reshape(-1, self.rank)
        scale = tensors.get("markov_w2.scale")
        if scale is not None:
            self.w2 = self.w2 * float(self._dense(scale).reshape(-1)[0])
        d2t = tensors.get("d2t")
        self.columns = None if d2t is None else np.asarray(d2t.data, dtype=np.int64).reshape(-1)
        self._rows: dict[int, np.ndarray] = {}
        # the confidence head, sigmoid(w · [h; W1[prev]] + b), split into its hidden and Markov parts
        conf = tensors.get("conf_proj.weight")
        self.conf_w = None if conf is None else self._dense(conf).reshape(-1)
        bias = tensors.get("conf_proj.bias")
        self.conf_b = 0.0 if bias is None else float(self._dense(bias).reshape(-1)[0])

    def _dense(self, t, rows=slice(None)) -> np.ndarray:
        data = t.data[rows]
        if data.dtype == np.uint8:            # quantized blocks
            return self._dequantize(data, t.tensor_type).astype(np.float32)
        return np.asarray(data, dtype=np.float32)

    def w1(self, prev: int) -> np.ndarray:
        row = self._rows.get(prev)
        if row is None:
            row = self._rows[prev] = self._dense(self._w1, slice(prev, prev + 1)).reshape(self.rank)
        return row

    def bias(self, prev: int) -> np.ndarray:
        """[columns] W2·W1[prev]."""
        return self.w2 @ self.w1(prev)

    def confidence(self, hidden: np.ndarray, prevs: list[int]) -> np.ndarray:
        """[n] the confidence head on hidden rows [n, H] whose slots follow the tokens `prevs`."""
        H = hidden.shape[1]
        z = hidden @ self.conf_w[:H] + np.array([self.w1(p) for p in prevs]) @ self.conf_w[H:] + self.conf_b
        return 1.0 / (1.0 + np.exp(-z))


class DSparkSource(DFlashSource):
    member = DSPARK.name
    rates_by_probability = False              # its ratings come from its confidence head (--draft-confidence)
    reads_draft_vocab_rows = False            # its Markov head biases the vocabulary's rows

    def __init__(self, *args, markov_in_graph: bool | None = None, **kwargs):
        """markov_in_graph: where the chain runs; None: in the graph when the drafter is offloaded to a GPU,
        here otherwise."""
        super().__init__(*args, **kwargs)
        anchor = self.model.meta("dflash.sample_from_anchor")
        self.anchor_first = DSPARK.defaults["sample_from_anchor"] if anchor is None else anchor.lower() == "true"
        self.markov: NumpyMarkovHead | None = None
        self.rates_slots = False                 # hand the confidence head's estimates to the loop
        self.place_chain(self.model.on_gpu if markov_in_graph is None else markov_in_graph)

    def rate_slots(self) -> bool:
        """Return each draft's confidence from now on (DSpark's confidence head); False when the file has none."""
        if not any(t.name == "conf_proj.weight" for t in parse_header(self.model.path).tensors):
            return False
        self.ctx.enable_nextn()                 # the head's output (graph) or its input rows (numpy chain)
        self.rates_slots = True
        return True

    def place_chain(self, in_graph: bool) -> None:
        """Chain the Markov head in llama.cpp's graph or here (from the next draft on)."""
        self.markov = None if in_graph else (self.markov or NumpyMarkovHead(self.model.path))
        self.ctx.set_markov_head_in_graph(in_graph)

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        first = 0 if self.anchor_first else 1
        # the graph skips the Markov head when the block is longer than the trained block size
        rows = self._decode_block(last_token, pos, max(n + first, 1))
        logits = self.driver.logits(rows)[first:first + n]
        if self.markov is None:
            proposal = Proposal([int(t) for t in logits.argmax(axis=1)], np.array(logits) if want_logits else None)
            if self.rates_slots:                 # the graph's head wrote them, broadcast over nextn rows
                proposal.confidence = np.array(self.ctx.nextn_rows(rows)[first:first + n, 0], dtype=np.float64)
        else:
            proposal = self.chain(logits, last_token, want_logits, pick)
            if self.rates_slots:                 # nextn rows hold the head's input: the final-normed hidden rows
                hidden = np.asarray(self.ctx.nextn_rows(rows)[first:first + n], dtype=np.float64)
                proposal.confidence = self.markov.confidence(hidden, [last_token] + proposal.tokens[:-1])
        self.driver.drop_block(pos)
        return proposal

    def chain(self, backbone: np.ndarray, anchor: int, want_logits: bool, pick=None) -> Proposal:
        """The Markov chain over the backbone's slot logits [n, V]: each slot biased by the token drafted before
        it (the anchor for the first). pick (T > 0, rejection mode): draws each slot's token, `pick(row) ->
        (token, q)`; otherwise the argmax."""
        head, cols = self.markov, self.markov.columns
        tokens, rows, qs, prev = [], [], [], anchor
        for base in backbone:
            chained = (base if cols is None else base[cols]) + head.bias(prev)
            if pick is None and not want_logits:
                best = int(chained.argmax())
                prev = best if cols is None else int(cols[best])
                tokens.append(prev)
                continue
            row = chained if cols is None else np.full(self.n_vocab, -np.inf, dtype=np.float32)
            if cols is not None:
                row[cols] = chained
            if pick is None:
                prev = int(row.argmax())
            else:
                prev, q = pick(row)
                prev = int(prev)
                qs.append(q)
            tokens.append(prev)
            rows.append(row)
        return Proposal(tokens, np.stack(rows) if want_logits and rows else None, np.stack(qs) if qs else None)
