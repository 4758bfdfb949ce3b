"""Small owning wrappers over llama-cpp-python's low-level API: Model, Context, Batch.

The engine talks to these only; they own their native handles (a context is freed before its
model) and turn llama_decode's return codes into distinct exceptions.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .lib import NativeLibrary, held_log, load


class DecodeError(RuntimeError):
    """llama_decode failed."""

    def __init__(self, code: int, what: str):
        super().__init__(f"{what}: llama_decode returned {code}")
        self.code = code


class NoKVSlot(DecodeError):
    """rc 1: the KV cache has no room for the batch (context full); not fatal, the caller may trim."""


class DecodeAborted(DecodeError):
    """rc 2: the abort callback stopped the decode."""


class ModelLoadError(RuntimeError):
    """A GGUF file could not be loaded."""


class ModelClosedError(RuntimeError):
    """A model was used after `close()`: its llama.cpp handles point into freed memory."""


class TapError(RuntimeError):
    """Layer taps requested that the model cannot provide."""


def _load_reason(log: list[str]) -> str:
    """llama.cpp's own reason from its log: `llama_model_load: error loading model: <reason>`."""
    lines = "".join(log).splitlines()
    for line in lines:
        if "error loading model:" in line:
            return line.split("error loading model:", 1)[1].strip()
    return lines[-1].strip() if lines else "no reason given"


def _decode_error(code: int, what: str) -> DecodeError:
    return {1: NoKVSlot, 2: DecodeAborted}.get(code, DecodeError)(code, what)


@dataclass
class TensorOverride:
    """One `tensor_buft_overrides` entry: tensors whose name matches `pattern` go to `buffer_type`."""
    pattern: str
    buffer_type: str   # "CPU", "CUDA0", ...


class Model:
    def __init__(self, path: str | Path, *, n_gpu_layers: int = 0, use_mmap: bool = True,
                 overrides: Sequence[TensorOverride] = (), main_gpu: int = 0,
                 tensor_split: Sequence[float] | None = None, rpc_servers: str | None = None,
                 devices: Sequence[str] = ()):
        """devices: ggml device names to place layers on (llama.cpp's --device), "none" for the CPU only;
        empty: every GPU device of the build."""
        self.native: NativeLibrary = load()
        L = self.native.llama_cpp
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()   # freed before the model (close)
        self.path = Path(path)
        self.n_gpu_layers, self.devices = n_gpu_layers, tuple(devices)
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: no such file")
        params = L.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        if not use_mmap:
            params.load_mode = 0     # LLAMA_LOAD_MODE_NONE (default: auto)
        params.main_gpu = main_gpu
        self._keepalive: list = []
        if tensor_split:
            arr = (ctypes.c_float * 128)(*tensor_split)
            self._keepalive.append(arr)
            params.tensor_split = ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))
        if overrides:
            from .offload import build_override_array  # noqa: PLC0415 - only with offload
            arr = build_override_array(self.native, overrides)
            self._keepalive.append(arr)
            params.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)
        if rpc_servers or devices:
            from .offload import add_rpc_servers, device_array  # noqa: PLC0415
            arr = (add_rpc_servers(self.native, rpc_servers) if rpc_servers else
                   device_array(self.native, devices))
            self._keepalive.append(arr)
            params.devices = ctypes.cast(arr, ctypes.c_void_p)
        with held_log() as log:
            self._ptr = L.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._ptr:
            raise ModelLoadError(f"{self.path}: llama.cpp could not load this GGUF ({_load_reason(log)}); "
                                 "check that the file is complete and of a supported architecture")
        sys.stderr.write("".join(log))
        self._vocab = L.llama_model_get_vocab(self._ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self.n_embd = L.llama_model_n_embd(self.ptr)
        self.n_layer = L.llama_model_n_layer(self.ptr)
        self.arch = self.meta("general.architecture") or "?"

    def _require_open(self) -> None:
        if not self._ptr:
            raise ModelClosedError(f"{self.path.name}: this model was closed; load the file again to use it")

    @property
    def ptr(self):
        """The llama_model handle; a closed model refuses to hand it out (its memory is freed)."""
        self._require_open()
        return self._ptr

    @property
    def vocab(self):
        """The model's vocabulary handle, freed with the model like `ptr`."""
        self._require_open()
        return self._vocab

    @property
    def on_gpu(self) -> bool:
        """Whether layers of this model were offered to a GPU device (-ngl != 0 and the build has one, or
        devices were named)."""
        if self.n_gpu_layers == 0 or list(self.devices) == ["none"]:
            return False
        from .offload import gpu_free_bytes  # noqa: PLC0415
        return bool(self.devices) or bool(gpu_free_bytes(self.native))

    # metadata -------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = self.native.llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def target_layer_ids(self) -> list[int]:
        api = self.native.dflash
        n = api.model_target_layer_ids(self.ptr, None, 0)
        out = (ctypes.c_int32 * max(n, 1))()
        api.model_target_layer_ids(self.ptr, out, n)
        return list(out[:n])

    def block_size(self) -> int:
        return self.native.dflash.model_block_size(self.ptr)

    def mask_token(self) -> int:
        return self.native.dflash.model_mask_token(self.ptr)

    def draft_vocab(self) -> np.ndarray | None:
        """A drafter's reduced draft vocabulary: the target token id of each head row (d2t), or None."""
        api = self.native.dflash
        n = api.model_draft_vocab(self.ptr, None, 0)
        if n <= 0:
            return None
        out = np.empty(n, dtype=np.int64)
        api.model_draft_vocab(self.ptr, out.ctypes.data, n)
        return out

    # vocabulary -----------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        L = self.native.llama_cpp
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        L = self.native.llama_cpp
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def has_recurrent_state(self) -> bool:
        """Recurrent or hybrid (e.g. gated delta-net) layers, whose state seq_rm cannot roll back."""
        L = self.native.llama_cpp
        return bool(L.llama_model_is_recurrent(self.ptr) or L.llama_model_is_hybrid(self.ptr))

    def is_eog(self, token: int) -> bool:
        return bool(self.native.llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def bos(self) -> int:
        return self.native.llama_cpp.llama_vocab_bos(self.vocab)

    def eos(self) -> int:
        return self.native.llama_cpp.llama_vocab_eos(self.vocab)

    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    def close(self) -> None:
        """Free the model, and first every context still open on it: llama.cpp's contexts use their model's
        tensors until they are freed, so a context left to the garbage collector after its model would free
        into released memory."""
        if getattr(self, "_ptr", None):
            for ctx in list(self._contexts):   # set before _ptr, so present here
                ctx.close()
            self.native.llama_cpp.llama_model_free(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()


@dataclass
class ContextSettings:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0            # 0: all cores
    n_threads_batch: int = 0
    n_rs_seq: int = 0             # recurrent-state snapshots for rollback (hybrid targets)
    n_seq_max: int = 1            # parallel sequences (batched data generation)
    flash_attn: str = "auto"      # "auto" | "on" | "off"
    type_k: str | None = None     # e.g. "q8_0"
    type_v: str | None = None


_FA = {"auto": -1, "off": 0, "on": 1}


class Context:
    def __init__(self, model: Model, settings: ContextSettings | None = None, *, other: "Context | None" = None):
        import os  # noqa: PLC0415
        self.model = model
        self.native = model.native
        L = self.native.llama_cpp
        s = settings or ContextSettings()
        p = L.llama_context_default_params()
        p.n_ctx = s.n_ctx
        p.n_batch = s.n_batch
        p.n_ubatch = s.n_ubatch
        p.n_seq_max = s.n_seq_max
        threads = s.n_threads or os.cpu_count() or 1
        p.n_threads = threads
        p.n_threads_batch = s.n_threads_batch or threads
        p.n_rs_seq = s.n_rs_seq
        p.flash_attn_type = _FA[s.flash_attn]
        p.no_perf = True
        for attr, name in (("type_k", s.type_k), ("type_v", s.type_v)):
            if name:
                setattr(p, attr, _ggml_type(self.native, name))
        if other is not None:
            p.ctx_other = other.ptr
        self._other = other            # keeps the linked context alive
        self._linked: weakref.WeakSet[Context] = weakref.WeakSet()   # contexts reading this one's memory
        self.ptr = L.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            kv = [f"{flag} {t}" for flag, t in (("-ctk", s.type_k), ("-ctv", s.type_v)) if t and t != "f16"]
            hint = f", or choose other KV cache types than {' '.join(kv)} (llama.cpp's log says why)" if kv else ""
            raise ModelLoadError(f"{model.path}: could not create a llama context (n_ctx={s.n_ctx}); "
                                 f"lower -c/--ctx-size or free memory{hint}")
        model._contexts.add(self)
        if other is not None:
            other._linked.add(self)
        self.settings = s
        self.memory = L.llama_get_memory(self.ptr)
        self.n_ctx = L.llama_n_ctx(self.ptr)
        self.n_vocab = model.n_vocab
        self.logit_cols = model.n_vocab     # floats per logit row (a drafter's draft vocabulary, when asked)
        self._taps: list[int] = []
        self.taps_width = 0
        self._tap_buf: np.ndarray | None = None

    # decode ----------------------------------------------------------------------------------
    def decode(self, batch: "Batch", what: str = "decode") -> None:
        if not self.ptr:
            raise DecodeError(-1, f"{self.model.path.name}: {what} on a closed context (closed itself, with its "
                                   "model or with the context it reads); open a new one")
        rc = self.native.llama_cpp.llama_decode(self.ptr, batch.raw)
        if rc != 0:
            raise _decode_error(rc, f"{self.model.path.name}: {what} of {batch.n_tokens} rows")

    def graphs_reused(self) -> int:
        """How many decodes ran a compute graph kept from before instead of building one."""
        return int(self.native.llama_cpp.llama_perf_context(self.ptr).n_reused)

    def logits(self, i: int) -> np.ndarray:
        """Logits of output row i of the last decode (a view, valid until the next decode)."""
        ptr = self.native.llama_cpp.llama_get_logits_ith(self.ptr, i)
        return np.ctypeslib.as_array(ptr, shape=(self.logit_cols,))

    def logits_all(self, n_outputs: int) -> np.ndarray:
        """[n_outputs, logit_cols] view of all output rows of the last decode, in batch order."""
        ptr = self.native.llama_cpp.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.logit_cols))

    def set_draft_vocab_logits(self, on: bool) -> bool:
        """A drafter with a reduced draft vocabulary: logit rows of its head rows only, in d2t order (on), or
        the vocabulary's rows with -inf outside it (off, llama.cpp's way). From the next decode; False, with
        nothing changed, where the model has no d2t or chains a head over its logits (DSpark, DFlash2)."""
        cols = self.native.dflash.set_draft_vocab_logits(self.ptr, on)
        if cols <= 0:
            return False
        self.logit_cols = cols
        return True

    def enable_nextn(self) -> None:
        """Copy the graph's "nextn" rows (every batch row) out of each decode: the DFlash2 selector lattice."""
        api = self.native.dflash.nextn
        if api is None:
            raise ModelLoadError(f"{self.model.path.name}: this llama.cpp build does not export "
                                 "llama_get_embeddings_nextn, which DFlash2 drafting needs; rebuild it on Linux/macOS")
        api.set_embeddings_nextn(self.ptr, True, False)

    def nextn_rows(self, n_rows: int) -> np.ndarray:
        """[n_rows, n_embd] view of the nextn rows of the last decode (valid until the next decode)."""
        ptr = self.native.dflash.nextn.get_embeddings_nextn(self.ptr)
        if not ptr:
            raise DecodeError(-1, f"{self.model.path.name}: the last decode produced no nextn rows")
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.model.n_embd))

    def set_causal(self, causal: bool) -> None:
        self.native.llama_cpp.llama_set_causal_attn(self.ptr, causal)

    def set_markov_head_in_graph(self, in_graph: bool) -> None:
        """DSpark drafters: chain the Markov head in the dflash graph (llama.cpp's default), or return the
        backbone's logits and leave the chain to the caller (patches/0009)."""
        if self.native.dflash.set_markov_head_in_graph(self.ptr, in_graph) != 0:
            raise ModelLoadError(f"{self.model.path.name}: not a DSpark drafter (no markov_w1.weight)")

    # taps ------------------------------------------------------------------------------------
    def set_taps(self, layer_ids: Sequence[int]) -> None:
        ids = (ctypes.c_int32 * max(len(layer_ids), 1))(*layer_ids)
        rc = self.native.dflash.set_layer_taps(self.ptr, ids, len(layer_ids))
        if rc != 0:
            raise TapError(f"{self.model.path.name}: cannot tap layers {list(layer_ids)} "
                           f"(valid ids 0..{self.model.n_layer}, no repeats)")
        self._taps = list(layer_ids)
        self.taps_width = len(layer_ids) * self.model.n_embd      # floats per row of get_taps

    @property
    def taps(self) -> list[int]:
        return list(self._taps)

    def outputs_for_taps(self, wanted: str) -> str:
        """The output rows a decode must ask for ("last", "none": what the caller wants of the logits) so that
        get_taps is right for every row: llama.cpp computes the last layer for output rows only, so a tap of the
        final output (id n_layer) needs every row to be one."""
        return "all" if self.model.n_layer in self._taps else wanted

    def get_taps(self, i0: int, n_rows: int, out: np.ndarray | None = None) -> np.ndarray:
        """Features of batch rows [i0, i0+n_rows) of the last decode: [n_rows, n_taps*n_embd] float32."""
        width = len(self._taps) * self.model.n_embd
        if out is None:
            out = np.empty((n_rows, width), dtype=np.float32)
        elif out.shape != (n_rows, width) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"get_taps: out must be a C-contiguous float32 [{n_rows}, {width}] array, "
                             f"got {out.dtype} {out.shape}")
        rc = self.native.dflash.get_layer_taps(self.ptr, i0, n_rows, out.ctypes.data)
        if rc != 0:
            self._tap_error(rc, i0, n_rows)
        return out

    def read_taps(self, i0: int, n_rows: int, into: "TapRows") -> np.ndarray:
        """get_taps into a reusable buffer: returns its first n_rows rows, valid until it is read into again."""
        if n_rows > into.capacity or into.width != self.taps_width:
            raise ValueError(f"read_taps: {n_rows} rows of width {self.taps_width} do not fit a buffer of "
                             f"{into.capacity} x {into.width}")
        rc = self.native.dflash.get_layer_taps(self.ptr, i0, n_rows, into.address)
        if rc != 0:
            self._tap_error(rc, i0, n_rows)
        return into.array[:n_rows]

    def _tap_error(self, rc: int, i0: int, n_rows: int) -> None:
        if rc == -3:
            raise TapError(f"{self.model.path.name}: architecture '{self.model.arch}' does not record layer "
                           f"inputs for taps {self._taps}; see README 'Covered target architectures'")
        raise TapError(f"{self.model.path.name}: get_taps(rows {i0}..{i0 + n_rows}) failed with {rc} "
                       f"(last batch had {self.native.dflash.n_rows_last(self.ptr)} rows, taps {self._taps})")

    # memory ----------------------------------------------------------------------------------
    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> bool:
        """Remove positions [p0, p1) of a sequence; False when the memory cannot (recurrent state)."""
        return bool(self.native.llama_cpp.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def pos_max(self) -> int:
        return self.native.llama_cpp.llama_memory_seq_pos_max(self.memory, 0)

    def pos_min(self) -> int:
        return self.native.llama_cpp.llama_memory_seq_pos_min(self.memory, 0)

    def clear(self) -> None:
        self.native.llama_cpp.llama_memory_clear(self.memory, True)

    def n_rs_seq(self) -> int:
        return self.native.llama_cpp.llama_n_rs_seq(self.ptr)

    def state_get(self, *, partial: bool = True) -> bytes:
        """Sequence-0 state: partial (recurrent-only, for checkpoint + replay rollback) or whole (KV cache and
        recurrent state, for a prompt cache that keeps a conversation in RAM)."""
        L = self.native.llama_cpp
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        size = L.llama_state_seq_get_size_ext(self.ptr, 0, flags)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data_ext(self.ptr, buf, size, 0, flags)
        return bytes(memoryview(buf)[:n])     # one copy (buf[:n] would build a list of ints)

    def state_set(self, data: bytes, *, partial: bool = True) -> None:
        L = self.native.llama_cpp
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        n = L.llama_state_seq_set_data_ext(self.ptr, buf, len(data), 0, flags)
        if n == 0:
            raise RuntimeError(f"{self.model.path.name}: restoring the sequence state failed")

    def close(self) -> None:
        """Free the context, and first the contexts linked to it (a drafter's reads this one's memory)."""
        if getattr(self, "ptr", None):
            for ctx in list(self._linked):     # set before ptr, so present here
                ctx.close()
            self.native.llama_cpp.llama_free(self.ptr)
            self.ptr = None

    def __del__(self):
        self.close()


class TapRows:
    """A float32 [capacity, width] buffer that `Context.read_taps` fills without building a ctypes pointer per
    call: right after a decode numpy's `.ctypes` costs ~35 us, the whole read through a stored address ~7 us
    (measured: SmolLM2-135M, one row of 4 taps, 2-core EPYC, thread CPU time), and the loop reads every step."""

    def __init__(self, capacity: int, width: int):
        self.capacity, self.width = capacity, width
        self.array = np.empty((capacity, width), dtype=np.float32)
        self.address = self.array.ctypes.data


class Batch:
    """A reusable llama_batch for one sequence: token rows or embedding rows of a fixed width."""

    def __init__(self, native: NativeLibrary, capacity: int, embd_width: int = 0):
        self.native = native
        self.capacity = capacity
        self.embd_width = embd_width
        self.raw = native.llama_cpp.llama_batch_init(capacity, embd_width, 1)
        r = self.raw
        self._pos = np.ctypeslib.as_array(r.pos, shape=(capacity,))
        self._nseq = np.ctypeslib.as_array(r.n_seq_id, shape=(capacity,))
        self._logits = np.ctypeslib.as_array(r.logits, shape=(capacity,))
        for i in range(capacity):
            r.seq_id[i][0] = 0
        self._nseq[:] = 1
        if embd_width:
            self._embd = np.ctypeslib.as_array(r.embd, shape=(capacity, embd_width))
        else:
            self._tok = np.ctypeslib.as_array(r.token, shape=(capacity,))
        self.n_tokens = 0

    def set_tokens(self, tokens: Sequence[int], pos0: int, logits: str | Sequence[bool] = "all") -> None:
        n = len(tokens)
        self._check(n)
        self._tok[:n] = tokens
        self._fill(n, pos0, logits)

    def set_embd(self, rows: np.ndarray, pos0: int, logits: str | Sequence[bool] = "none") -> None:
        n = rows.shape[0]
        self._check(n)
        assert rows.shape[1] == self.embd_width, (rows.shape, self.embd_width)
        self._embd[:n] = rows
        self._fill(n, pos0, logits)

    def set_rows(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int],
                 logits: str | Sequence[bool] = "all") -> None:
        """Rows of several sequences in one batch (batched generation): token, position and sequence per row."""
        n = len(tokens)
        self._check(n)
        self._tok[:n] = tokens
        self._pos[:n] = positions
        for i, s in enumerate(seqs):
            self.raw.seq_id[i][0] = s
        self._fill_logits(n, logits)
        self._seq_dirty = True

    def tokens(self, n: int | None = None) -> list[int]:
        """The token ids of the first n rows currently in the batch."""
        return [int(t) for t in self._tok[:self.n_tokens if n is None else n]]

    def _check(self, n: int) -> None:
        if not 0 < n <= self.capacity:
            raise ValueError(f"batch of {n} rows does not fit capacity {self.capacity}")
        if self.embd_width == 0 and not hasattr(self, "_tok"):
            raise ValueError("token rows in an embedding batch")

    def _fill(self, n: int, pos0: int, logits) -> None:
        self._pos[:n] = np.arange(pos0, pos0 + n, dtype=self._pos.dtype)
        if getattr(self, "_seq_dirty", False):
            for i in range(self.capacity):
                self.raw.seq_id[i][0] = 0
            self._seq_dirty = False
        self._fill_logits(n, logits)

    def _fill_logits(self, n: int, logits) -> None:
        if logits == "all":
            self._logits[:n] = 1
        elif logits == "last":
            self._logits[:n] = 0
            self._logits[n - 1] = 1
        elif logits == "none":
            self._logits[:n] = 0
        else:
            self._logits[:n] = np.asarray(logits, dtype=bool)
        self.raw.n_tokens = n
        self.n_tokens = n

    def close(self) -> None:
        if getattr(self, "raw", None) is not None:
            self.native.llama_cpp.llama_batch_free(self.raw)
            self.raw = None

    def __del__(self):
        self.close()


def _ggml_type(native: NativeLibrary, name: str) -> int:
    types = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
    try:
        return types[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported KV cache type {name!r}; choose one of {', '.join(types)}") from None
