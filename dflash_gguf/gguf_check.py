"""One validation step for every GGUF a command reads, before llama.cpp sees it.

llama.cpp refuses most malformed files with a log line, but aborts the whole process (GGML_ASSERT) on
some (a block count of 0 or above 512, duplicate vocabulary entries, an unknown RoPE scaling name, …)
and reads past arrays that are shorter than the vocabulary. So every command parses the header here
first, from the bytes alone (tensor data is never read, so a 100 GB model is checked in milliseconds):

1. structure: magic, version, key/value and tensor-info counts bounded by the file size, every string
   and array inside the file, known value and tensor types, each tensor's data inside the file at the
   offset the layout puts it (catches truncation);
2. what llama.cpp asserts while loading hyper-parameters and the vocabulary;
3. the role: a target model, or a `dflash` drafter;
4. a drafter fits its target: hidden size, tap ids within the target's layers, vocabulary.

Each problem is a `BadModelFile` (exit code 2) whose message names the file, says what is wrong and
what to do. The GGUF reader (`gguf_reader.py`, convert's and the engine's) is built on `parse_header`.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import gguf_family
from .errors import UserError

VERSIONS = (2, 3)                   # what llama.cpp's gguf.cpp reads
MAX_STRING = 1 << 30                # gguf.cpp: GGUF_MAX_STRING_LENGTH
MAX_DIMS = 4                        # GGML_MAX_DIMS
MAX_TENSOR_BYTES = 1 << 48          # no real tensor comes near; keeps size arithmetic far from overflow
MAX_TENSOR_NAME = 63                # GGML_MAX_NAME - 1 (NUL)
MAX_LAYERS = 512                    # LLAMA_MAX_LAYERS: llama.cpp asserts 0 < block_count <= it
MAX_EXPERTS = 1024                  # LLAMA_MAX_EXPERTS
ROPE_SCALING = ("none", "linear", "yarn", "longrope")     # llama.cpp asserts one of these
# ggml types removed from GGUF files (ggml.h): their block and type sizes are 0 in ggml
REMOVED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
                 36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}
DRAFTER_ARCH = "dflash"
# drafter architectures of other projects: `dflash-gguf convert` turns them into DRAFTER_ARCH
FOREIGN_DRAFTER_ARCHS = ("dflash-draft", "qwen35-dflash-draft", "gemma4-dflash-draft", "dspark")

# GGUF value type → (struct format, size); 8 = string, 9 = array
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_INTEGERS = {0, 1, 2, 3, 4, 5, 10, 11}
_FLOATS = {6, 12}
_STRING, _ARRAY = 8, 9
_DAMAGED = "the file is damaged: download or convert it again"
_TRUNCATED = "the file is truncated (an interrupted download or copy?): download or convert it again"
_CUT = "the file is truncated or damaged: download or convert it again"


class BadModelFile(UserError):
    """A model file that no command may pass to llama.cpp; the message names it and says what to do."""


class BigEndianGGUF(BadModelFile):
    """A big-endian GGUF: llama.cpp on a little-endian machine cannot load it (convert can still read it)."""


@dataclass
class Field:
    value: Any
    types: list                     # [GGUFValueType] or [ARRAY, element GGUFValueType], like gguf-py's ReaderField

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]           # ggml ne order (innermost first)
    ggml_type: int
    offset: int                     # from the start of the data section
    nbytes: int


@dataclass
class GGUFHeader:
    path: Path
    version: int
    fields: dict[str, Field]
    tensors: list[TensorInfo]
    alignment: int
    data_start: int                 # absolute file offset of the data section
    file_size: int

    def value(self, key: str, default: Any = None) -> Any:
        f = self.fields.get(key)
        return default if f is None else f.value

    @property
    def arch(self) -> str | None:
        arch = self.value("general.architecture")
        return arch if isinstance(arch, str) else None

    def n_vocab(self) -> int | None:
        tokens = self.value("tokenizer.ggml.tokens")
        return len(tokens) if isinstance(tokens, list) else None


@functools.lru_cache(maxsize=None)
def _type_sizes() -> dict[int, tuple[str, int, int]]:
    """ggml type id → (name, block size, bytes per block) for every type a GGUF file may hold."""
    import gguf  # noqa: PLC0415
    return {t.value: (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType
            if t in gguf.GGML_QUANT_SIZES and t.value not in REMOVED_TYPES}


# -- 1. structure -----------------------------------------------------------------------------------
def parse_header(path: str | Path) -> GGUFHeader:
    """The validated header of `path` (cached while the file is unchanged). Raises BadModelFile."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise BadModelFile(f"{path}: no such file; check the path "
                           "(`dflash-gguf models` lists the GGUFs found on this machine)") from None
    except OSError as e:
        raise BadModelFile(f"{path}: cannot be read ({e.strerror}); check the path and its permissions") from None
    if path.is_dir():
        raise BadModelFile(f"{path}: is a folder, not a GGUF file; pass the .gguf file inside it")
    if not path.is_file():
        raise BadModelFile(f"{path}: is not a regular file; pass a .gguf model file")
    return _parse_cached(str(path), os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _parse_cached(shown: str, resolved: str, size: int, mtime_ns: int) -> GGUFHeader:
    path = Path(shown)
    if size == 0:
        raise BadModelFile(f"{path}: the file is empty (0 bytes); download or convert it again")
    try:
        with open(resolved, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise BadModelFile(f"{path}: cannot be read ({e.strerror}); check its permissions") from None
    try:
        return _Parser(path, buf).header()
    finally:
        buf.close()


class _Parser:
    def __init__(self, path: Path, buf: mmap.mmap):
        self.path, self.buf, self.size, self.pos = path, buf, len(buf), 0

    def fail(self, what: str, why: str = _DAMAGED):
        raise BadModelFile(f"{self.path}: {what}; {why}")

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            self.fail(f"{what} at byte {self.pos} needs {n} bytes, but the file ends at byte {self.size}",
                      _TRUNCATED)

    def unpack(self, fmt: str, what: str) -> tuple:
        n = struct.calcsize(fmt)
        self.need(n, what)
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return out

    def string(self, what: str) -> str:
        (n,) = self.unpack("<Q", f"the length of {what}")
        if n > MAX_STRING or n > self.size - self.pos:
            self.fail(f"{what} at byte {self.pos - 8} claims {n} bytes, more than the "
                      f"{self.size - self.pos} left in the file", _CUT)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} at byte {self.pos - n} is not valid UTF-8")

    def header(self) -> GGUFHeader:
        magic = self.buf[:4]
        if magic != b"GGUF":
            self.fail(f"not a GGUF file (its first bytes are {bytes(magic)!r}, not b'GGUF')",
                      "pass a .gguf model file")
        (version,) = self.unpack("<4xI", "the GGUF version")
        if version > 0xFFFF and struct.unpack(">I", struct.pack("<I", version))[0] in VERSIONS:
            raise BigEndianGGUF(f"{self.path}: a big-endian GGUF, which llama.cpp cannot load on this machine; "
                                "convert the original model again without --bigendian")
        if version not in VERSIONS:
            self.fail(f"GGUF version {version} is not one llama.cpp reads ({' or '.join(map(str, VERSIONS))})",
                      "convert the model again with a current llama.cpp / gguf-py" if version < 2 else _DAMAGED)
        n_tensors, n_kv = self.unpack("<QQ", "the tensor and key/value counts")
        # a key/value pair takes at least 12 bytes, a tensor info at least 25: bound the counts by the file
        if n_kv * 12 > self.size - self.pos:
            self.fail(f"the header claims {n_kv} key/value pairs, more than the file can hold", _CUT)
        if n_tensors * 25 > self.size - self.pos:
            self.fail(f"the header claims {n_tensors} tensors, more than the file can hold", _CUT)
        fields: dict[str, Field] = {}
        for i in range(n_kv):
            key = self.string(f"key {i + 1} of {n_kv}")
            if key in fields:
                self.fail(f"key '{key}' appears twice")
            (vtype,) = self.unpack("<I", f"the type of '{key}'")
            fields[key] = self.value(key, vtype)
        alignment = _alignment(self, fields)
        tensors = self.tensor_infos(n_tensors)
        data_start = -(-self.pos // alignment) * alignment if n_tensors else self.pos
        self.check_layout(tensors, alignment, data_start)
        return GGUFHeader(self.path, version, fields, tensors, alignment, data_start, self.size)

    def value(self, key: str, vtype: int) -> Field:
        import gguf  # noqa: PLC0415
        VT = gguf.GGUFValueType
        if vtype == _STRING:
            return Field(self.string(f"the value of '{key}'"), [VT.STRING])
        if vtype in _SCALARS:
            return Field(self.unpack(_SCALARS[vtype][0], f"the value of '{key}'")[0], [VT(vtype)])
        if vtype != _ARRAY:
            self.fail(f"'{key}' has value type {vtype}, which GGUF does not define")
        sub, n = self.unpack("<IQ", f"the array header of '{key}'")
        if sub == _STRING:
            if n * 8 > self.size - self.pos:
                self.fail(f"'{key}' claims {n} strings, more than the file can hold", _CUT)
            return Field(self.strings(key, n), [VT.ARRAY, VT.STRING])
        if sub not in _SCALARS:
            self.fail(f"'{key}' is an array of value type {sub}, which llama.cpp cannot read")
        fmt, width = _SCALARS[sub]
        if n * width > self.size - self.pos:
            self.fail(f"'{key}' claims {n} elements ({n * width} bytes), more than the "
                      f"{self.size - self.pos} bytes left in the file", _CUT)
        import numpy as np  # noqa: PLC0415
        dtype = np.dtype(fmt)
        values = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).tolist()
        self.pos += n * width
        return Field(values, [VT.ARRAY, VT(sub)])

    def strings(self, key: str, n: int) -> list[str]:
        """n length-prefixed strings (a vocabulary: 50k–250k of them): one tight loop, and only when it
        trips, a careful one that says where and why."""
        buf, pos, unpack = self.buf, self.pos, struct.Struct("<Q").unpack_from
        try:
            out = []
            for _ in range(n):
                (length,) = unpack(buf, pos)
                pos += 8
                out.append(buf[pos:pos + length].decode("utf-8"))
                pos += length
            if pos <= self.size:
                self.pos = pos
                return out
        except (struct.error, UnicodeDecodeError, OverflowError):
            pass
        return self.strings_carefully(key, n)

    def strings_carefully(self, key: str, n: int) -> list[str]:
        buf, size, pos, out = self.buf, self.size, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        for i in range(n):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"string {i} of '{key}'")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > size - pos:
                self.fail(f"string {i} of '{key}' at byte {pos - 8} claims {length} bytes, more than the "
                          f"{size - pos} left in the file", _CUT)
            try:
                out.append(buf[pos:pos + length].decode("utf-8"))
            except UnicodeDecodeError:
                self.fail(f"string {i} of '{key}' at byte {pos} is not valid UTF-8")
            pos += length
        self.pos = pos
        return out


    def tensor_infos(self, n: int) -> list[TensorInfo]:
        sizes, infos, seen = _type_sizes(), [], set()
        for i in range(n):
            name = self.string(f"the name of tensor {i + 1} of {n}")
            if len(name.encode()) > MAX_TENSOR_NAME:
                self.fail(f"tensor name '{name[:80]}' is longer than llama.cpp's {MAX_TENSOR_NAME} bytes")
            if name in seen:
                self.fail(f"tensor '{name}' appears twice")
            seen.add(name)
            (n_dims,) = self.unpack("<I", f"the dimension count of tensor '{name}'")
            if not 1 <= n_dims <= MAX_DIMS:
                self.fail(f"tensor '{name}' has {n_dims} dimensions (ggml allows 1 to {MAX_DIMS})")
            dims = self.unpack(f"<{n_dims}Q", f"the shape of tensor '{name}'")
            ggml_type, offset = self.unpack("<IQ", f"the type and offset of tensor '{name}'")
            if ggml_type not in sizes:
                known = f"a type removed from ggml ({REMOVED_TYPES[ggml_type]})" if ggml_type in REMOVED_TYPES \
                    else "not a ggml type this build knows"
                self.fail(f"tensor '{name}' has type {ggml_type}, {known}",
                          _DAMAGED if ggml_type not in REMOVED_TYPES else "convert the model again")
            type_name, block, type_size = sizes[ggml_type]
            if min(dims) < 1:
                self.fail(f"tensor '{name}' has shape {list(dims)} with an empty dimension")
            n_elements = math.prod(dims)
            if n_elements * type_size // block > MAX_TENSOR_BYTES:
                self.fail(f"tensor '{name}' has an impossible shape {list(dims)}")
            if dims[0] % block:
                self.fail(f"tensor '{name}': its rows of {dims[0]} values do not split into {type_name} "
                          f"blocks of {block}")
            infos.append(TensorInfo(name, tuple(dims), ggml_type, offset, n_elements // block * type_size))
        return infos

    def check_layout(self, tensors: list[TensorInfo], alignment: int, data_start: int) -> None:
        """llama.cpp requires each tensor's data right after the previous one's, padded to the alignment."""
        expected = 0
        for t in tensors:
            if t.offset != expected:
                self.fail(f"tensor '{t.name}' claims its data at offset {t.offset} of the data section, "
                          f"where the layout puts it at {expected}")
            end = data_start + t.offset + t.nbytes
            if end > self.size:
                self.fail(f"tensor '{t.name}' needs bytes up to {end}, but the file ends at byte {self.size}",
                          _TRUNCATED)
            expected += -(-t.nbytes // alignment) * alignment


def _alignment(p: _Parser, fields: dict[str, Field]) -> int:
    f = fields.get("general.alignment")
    if f is None:
        return 32
    if f.types[0].value != 4 or f.value == 0 or f.value & (f.value - 1):
        p.fail(f"general.alignment is {f.value!r}; it must be a power of two stored as uint32")
    return int(f.value)


# -- 2. what llama.cpp asserts while loading --------------------------------------------------------
def _int_key(h: GGUFHeader, key: str, lo: int, hi: int, required: bool = False, what: str = "") -> int | None:
    f = h.fields.get(key)
    if f is None:
        if required:
            raise BadModelFile(f"{h.path}: no {key} in the header; {what or 'is this a language model GGUF?'}")
        return None
    if len(f.types) != 1 or f.types[0].value not in _INTEGERS:
        raise BadModelFile(f"{h.path}: {key} is not an integer; {_DAMAGED}")
    if not lo <= f.value <= hi:
        raise BadModelFile(f"{h.path}: {key} = {f.value} is outside {lo}..{hi}; {_DAMAGED}")
    return int(f.value)


def _per_layer_ints(h: GGUFHeader, key: str, n_layer: int, lo: int, hi: int) -> None:
    """llama.cpp's get_key_or_arr: one integer, or one per layer."""
    f = h.fields.get(key)
    if f is None:
        return
    if len(f.types) == 1:
        _int_key(h, key, lo, hi)
        return
    if f.types[1].value not in _INTEGERS or len(f.value) != n_layer or not all(lo <= v <= hi for v in f.value):
        raise BadModelFile(f"{h.path}: {key} must be {n_layer} integers in {lo}..{hi} (one per layer); {_DAMAGED}")


def check_loadable(h: GGUFHeader) -> None:
    """The hyper-parameter and vocabulary facts llama.cpp asserts (aborting the process) or reads unchecked."""
    arch = h.arch
    if arch is None:
        raise BadModelFile(f"{h.path}: no general.architecture (a string) in the header; is this a model file?")
    n_layer = _int_key(h, f"{arch}.block_count", 1, MAX_LAYERS, required=True)
    _int_key(h, f"{arch}.embedding_length", 1, 1 << 20, required=True)
    _int_key(h, f"{arch}.context_length", 0, 1 << 31)
    _int_key(h, f"{arch}.nextn_predict_layers", 0, n_layer)
    n_expert = _int_key(h, f"{arch}.expert_count", 0, MAX_EXPERTS) or 0
    _per_layer_ints(h, f"{arch}.expert_used_count", n_layer, 1 if n_expert else 0, n_expert)
    if n_expert:
        groups = _int_key(h, f"{arch}.expert_group_count", 0, n_expert - 1) or 0
        if groups > 1 and n_expert % groups:
            raise BadModelFile(f"{h.path}: {n_expert} experts do not split into {groups} groups; {_DAMAGED}")
    else:
        _int_key(h, f"{arch}.expert_group_count", 0, 0)
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        _per_layer_ints(h, f"{arch}.{key}", n_layer, 0, 1 << 20)
    scaling = h.value(f"{arch}.rope.scaling.type")
    if scaling is not None and scaling not in ROPE_SCALING:
        raise BadModelFile(f"{h.path}: {arch}.rope.scaling.type is {scaling!r}, not one of "
                           f"{', '.join(ROPE_SCALING)}; {_DAMAGED}")
    _check_vocabulary(h)


def _check_vocabulary(h: GGUFHeader) -> None:
    tokens = h.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    if tokens.types[-1].value != _STRING or len(tokens.types) != 2:
        raise BadModelFile(f"{h.path}: tokenizer.ggml.tokens is not a list of strings; {_DAMAGED}")
    n = len(tokens.value)
    if n == 0:
        raise BadModelFile(f"{h.path}: the vocabulary (tokenizer.ggml.tokens) is empty; {_DAMAGED}")
    if len(set(tokens.value)) != n:
        raise BadModelFile(f"{h.path}: the vocabulary lists a token twice (llama.cpp aborts on that); {_DAMAGED}")
    # llama.cpp indexes these arrays by token id without checking their length or element type
    for key, types, what in (("tokenizer.ggml.scores", _FLOATS, "float32"),
                             ("tokenizer.ggml.token_type", {5}, "int32")):
        f = h.fields.get(key)
        if f is not None and (len(f.types) != 2 or f.types[1].value not in types or len(f.value) != n):
            raise BadModelFile(f"{h.path}: {key} must be {n} {what} values (one per token); {_DAMAGED}")
    for key, f in h.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and len(f.types) == 1 \
                and f.types[0].value not in _INTEGERS:
            raise BadModelFile(f"{h.path}: {key} is not an integer; {_DAMAGED}")


# -- 3. roles ---------------------------------------------------------------------------------------
def check_target(path: str | Path) -> GGUFHeader:
    """A target (language) model llama.cpp can load; raises BadModelFile naming the file otherwise."""
    h = parse_header(path)
    arch = h.arch
    if arch == DRAFTER_ARCH or arch in FOREIGN_DRAFTER_ARCHS:
        raise BadModelFile(f"{h.path}: is a DFlash drafter, not a target model; pass the model it drafts for "
                           "with -m (and the drafter with -md)")
    check_loadable(h)
    if h.n_vocab() is None:
        raise BadModelFile(f"{h.path}: has no vocabulary (tokenizer.ggml.tokens); a target must be a "
                           "language model with its tokenizer")
    return h


def check_drafter(path: str | Path, target: str | Path | None = None) -> GGUFHeader:
    """A `dflash` drafter llama.cpp can load (and, with `target`, that fits it)."""
    h = parse_header(path)
    arch = h.arch
    hint = f" --target {target}" if target else " --target TARGET.gguf"
    if arch in FOREIGN_DRAFTER_ARCHS:
        raise BadModelFile(f"{h.path}: is a '{arch}' drafter of another project; convert it first: "
                           f"dflash-gguf convert {path}{hint} -o draft.gguf")
    if arch != DRAFTER_ARCH:
        raise BadModelFile(f"{h.path}: is a '{arch}' model, not a DFlash drafter (architecture 'dflash'); pass "
                           "a drafter with -md (`dflash-gguf models` lists drafters that fit a target; "
                           "`dflash-gguf train` makes one)")
    check_loadable(h)
    taps = h.fields.get(f"{DRAFTER_ARCH}.target_layers")
    if taps is None or len(taps.types) != 2 or taps.types[1].value not in _INTEGERS or not taps.value:
        raise BadModelFile(f"{h.path}: no {DRAFTER_ARCH}.target_layers (the target layer ids it reads); "
                           f"convert it again: dflash-gguf convert SOURCE{hint} -o draft.gguf")
    _int_key(h, f"{DRAFTER_ARCH}.block_size", 2, 1 << 12, required=True,
             what="convert it again with dflash-gguf convert")
    _int_key(h, "tokenizer.ggml.mask_token_id", 0, 1 << 31, required=True,
             what="a drafter needs its mask token: convert it again with dflash-gguf convert")
    check_family(h)
    if target is not None:
        check_header_fits(h, check_target(target))
    return h


def drafter_member(h: GGUFHeader) -> gguf_family.Member:
    """Its member of the DFlash family (gguf_family.member_of); raises BadModelFile for a file claiming two."""
    try:
        return gguf_family.member_of({t.name for t in h.tensors})
    except ValueError as e:
        raise BadModelFile(f"{h.path}: {e}; {_DAMAGED}") from None


def check_family(h: GGUFHeader) -> gguf_family.Member:
    """The keys and tensor shapes of the member `h` is (what llama.cpp throws on or reads unchecked)."""
    member = drafter_member(h)
    if member.marker is None:
        return member
    dims = {t.name: gguf_family.squeeze(t.dims) for t in h.tensors}
    n_embd = int(h.value(f"{DRAFTER_ARCH}.embedding_length"))
    settings = {k: _int_key(h, f"{DRAFTER_ARCH}.{k}", 0, 1 << 20, required=True,
                            what=f"a {member.name} drafter needs it (its {member.part} are present); convert it "
                                 "again with dflash-gguf convert") for k in member.int_keys()}
    problems = member.problems(n_embd, settings)
    if problems:
        raise BadModelFile(f"{h.path}: {member.name} settings llama.cpp refuses: {'; '.join(problems)}; {_DAMAGED}")
    for key in member.bool_keys():
        f = h.fields.get(f"{DRAFTER_ARCH}.{key}")
        if f is not None and (len(f.types) != 1 or f.types[0].value not in (7, _STRING)
                              or str(f.value).lower() not in ("true", "false")):
            raise BadModelFile(f"{h.path}: {DRAFTER_ARCH}.{key} must be true or false; {_DAMAGED}")
    d2t = dims.get("d2t")
    n_vocab = h.n_vocab() or dims.get(member.vocab_tensor, (None,))[-1]
    want = member.shapes(n_embd, int(h.value(f"{DRAFTER_ARCH}.block_count")), n_vocab,
                         settings | member.from_tensors(dims), d2t[0] if d2t else None)
    want = {n: s for n, s in want.items() if n in dims or n not in member.optional}
    missing = sorted(n for n in want if n not in dims)
    if missing:
        raise BadModelFile(f"{h.path}: a {member.name} drafter without {', '.join(missing[:4])}; {_DAMAGED}")
    wrong = [f"{n} {list(dims[n])} (expected {list(gguf_family.squeeze(s))})" for n, s in want.items()
             if dims[n] != gguf_family.squeeze(s)]
    if wrong:
        raise BadModelFile(f"{h.path}: {member.name} tensor shapes do not fit its settings: {'; '.join(wrong[:3])}; "
                           f"{_DAMAGED}")
    return member


def fit_problems(n_embd: int, taps: list[int], mask_token: int, n_vocab: int | None,
                 target_n_embd: int, target_n_layer: int, target_n_vocab: int) -> list[str]:
    """Why a drafter with these facts cannot read this target's hidden states (empty: it can)."""
    problems = []
    if n_embd != target_n_embd:
        problems.append(f"hidden size {n_embd} != target hidden size {target_n_embd}")
    bad = [t for t in taps if not 0 <= t <= target_n_layer]
    if bad:
        problems.append(f"target layers {bad} out of range for a target with {target_n_layer} layers "
                        f"(valid tap ids 0..{target_n_layer})")
    if not 0 <= mask_token < target_n_vocab:
        problems.append(f"mask token id {mask_token} is outside the target vocabulary ({target_n_vocab} tokens)")
    if n_vocab and n_vocab > target_n_vocab:
        problems.append(f"vocabulary size {n_vocab} exceeds the target's {target_n_vocab}")
    return problems


def check_header_fits(drafter: GGUFHeader, target: GGUFHeader) -> None:
    """Refuse a drafter whose header says it cannot read this target's hidden states (the engine's and the
    validator's check; convert checks the config it writes with convert/checks.check_config_fits)."""
    t_arch = target.arch
    problems = fit_problems(
        int(drafter.value(f"{DRAFTER_ARCH}.embedding_length")), [int(t) for t in
                                                              drafter.value(f"{DRAFTER_ARCH}.target_layers")],
        int(drafter.value("tokenizer.ggml.mask_token_id")), drafter.n_vocab(),
        int(target.value(f"{t_arch}.embedding_length")), int(target.value(f"{t_arch}.block_count")),
        target.n_vocab() or 0)
    refuse_misfit(str(drafter.path), target.path, problems)


def refuse_misfit(drafter: str, target: Path, problems: list[str], error: type[UserError] = BadModelFile) -> None:
    """The one "does not fit" error, with every problem and what to do (convert's and the validator's)."""
    if problems:
        raise error(f"{drafter}: does not fit target {target.name}: " + "; ".join(problems)
                    + f". Use the drafter made for this target, or train one: "
                      f"dflash-gguf train -m {target} -o draft.gguf")

