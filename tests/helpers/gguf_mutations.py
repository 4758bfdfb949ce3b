"""Seeded, bounded mutations of a GGUF file for the fuzz suite (tests/test_fuzz_gguf.py).

The layout is found by a walk written here, independent of the validator under test. Tensor data is
never mutated, and a mutated file keeps only its (patched) header bytes: the data section is a sparse
hole of the right length, so hundreds of 100 MB variants cost a few MB of writes each.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
HUGE = (1 << 63, 1 << 40, 1 << 32, 0xFFFFFFFFFFFFFFFF)


@dataclass
class KV:
    key: str
    start: int                    # the key length field
    type_pos: int
    vtype: int
    value_pos: int                # value, or the array's element type field
    end: int
    sub: int | None = None        # array element type
    count: int | None = None      # array length
    strings: list[tuple[int, int]] = field(default_factory=list)   # (length field pos, length) of each string


@dataclass
class TensorInfo:
    name: str
    start: int
    ndims_pos: int
    dims_pos: int
    type_pos: int
    offset_pos: int
    end: int
    offset: int


@dataclass
class Layout:
    size: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    data_start: int

    @property
    def kv_end(self) -> int:
        return self.kvs[-1].end

    @property
    def infos_end(self) -> int:
        return self.tensors[-1].end


def walk(path: Path) -> Layout:
    with open(path, "rb") as f:
        data = f.read(32 << 20)                   # the headers of our files are < 4 MB
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)

    def string(p: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", data, p)
        return data[p + 8:p + 8 + n].decode(), p + 8 + n

    kvs = []
    for _ in range(n_kv):
        start = pos
        key, pos = string(pos)
        (vtype,) = struct.unpack_from("<I", data, pos)
        kv = KV(key, start, pos, vtype, pos + 4, 0)
        pos += 4
        if vtype == 8:
            kv.strings.append((pos, struct.unpack_from("<Q", data, pos)[0]))
            _, pos = string(pos)
        elif vtype == 9:
            kv.sub, kv.count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if kv.sub == 8:
                for i in range(kv.count):
                    kv.strings.append((pos, struct.unpack_from("<Q", data, pos)[0]))
                    _, pos = string(pos)
            else:
                pos += kv.count * _FIXED[kv.sub]
        else:
            pos += _FIXED[vtype]
        kv.end = pos
        kvs.append(kv)
    tensors = []
    for _ in range(n_tensors):
        start = pos
        name, pos = string(pos)
        (nd,) = struct.unpack_from("<I", data, pos)
        dims_pos = pos + 4
        type_pos = dims_pos + 8 * nd
        (offset,) = struct.unpack_from("<Q", data, type_pos + 4)
        tensors.append(TensorInfo(name, start, pos, dims_pos, type_pos, type_pos + 4, type_pos + 12, offset))
        pos = type_pos + 12
    return Layout(path.stat().st_size, kvs, tensors, -(-pos // 32) * 32)


@dataclass
class Mutation:
    cls: str                      # the mutation class (what the issue lists)
    label: str
    patches: list[tuple[int, bytes]] = field(default_factory=list)
    size: int | None = None       # truncate to this many bytes

    def write(self, source_header: bytes, layout: Layout, out: Path) -> Path:
        size = layout.size if self.size is None else self.size
        head = bytearray(source_header[: min(size, layout.data_start)])
        for pos, raw in self.patches:
            if pos < len(head):
                head[pos:pos + len(raw)] = raw[: len(head) - pos]
        with open(out, "wb") as f:
            f.write(head)
            f.truncate(size)      # the data section: a hole of the right length
        return out


def _u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def mutations(layout: Layout, source_header: bytes, seed: int, *, n_truncations: int, n_flips: int) -> list[Mutation]:
    """Every class the fuzz suite covers, bounded and reproducible for one seed."""
    rng = random.Random(seed)
    L = layout
    out: list[Mutation] = []

    # truncations at structural boundaries: the fixed header, every KV (start, type, value), a sample of
    # tensor infos and tensor data starts, the aligned data start, one byte short of the end, and empty
    header = [0, 3, 4, 7, 8, 15, 16, 23, 24]
    kv_cuts = [p for kv in L.kvs for p in (kv.start + 4, kv.type_pos, kv.value_pos + 2, kv.end - 1)]
    info_cuts = [p for t in L.tensors for p in (t.start + 3, t.dims_pos + 1, t.offset_pos)]
    data_cuts = [L.data_start + t.offset + 1 for t in L.tensors] + [L.data_start, L.size - 1]
    budget = max(n_truncations - len(header), 0)
    sample = (rng.sample(kv_cuts, min(len(kv_cuts), budget // 3))
              + rng.sample(info_cuts, min(len(info_cuts), budget // 3))
              + rng.sample(data_cuts, min(len(data_cuts), budget - 2 * (budget // 3))))
    for p in header + sorted(sample):
        out.append(Mutation("truncation", f"truncated at byte {p}", size=p))

    # random byte flips (1..20 bytes) in the key/value section and in the tensor infos; every other header
    # mutation writes printable ASCII instead, which keeps strings valid UTF-8 and reaches deeper checks
    for cls, lo, hi in (("header flips", 8, L.kv_end), ("tensor-info flips", L.kv_end, L.infos_end)):
        for k in range(n_flips):
            where = [rng.randrange(lo, hi) for _ in range(rng.randint(1, 20))]
            if cls == "header flips" and k % 2:
                patches = [(p, bytes([rng.randrange(0x21, 0x7F)])) for p in where]
                out.append(Mutation(cls, f"{len(where)} bytes set to ASCII", patches))
            else:
                patches = [(p, bytes([source_header[p] ^ rng.randrange(1, 256)])) for p in where]
                out.append(Mutation(cls, f"{len(where)} bytes flipped", patches))

    # well-formed changes of values: characters inside vocabulary strings (never their length fields) and
    # numbers; most pass validation, so they show what llama.cpp does with what the validator lets through
    arrays = [kv for kv in L.kvs if kv.sub == 8 and kv.count > 100]
    numbers = [kv for kv in L.kvs if kv.vtype in (4, 6) and kv.key.endswith(("context_length", "freq_base",
                                                                             "layer_norm_rms_epsilon"))]
    for k in range(n_flips // 3):
        if k % 3 == 2 and numbers:
            kv = rng.choice(numbers)
            raw = _u32(rng.randrange(1, 1 << 20)) if kv.vtype == 4 else struct.pack("<f", rng.uniform(1e-6, 1e6))
            out.append(Mutation("value changes", f"{kv.key} -> {raw.hex()}", [(kv.value_pos, raw)]))
            continue
        kv = rng.choice(arrays)
        patches = []
        for pos, n in rng.sample(kv.strings, 5):
            if n:
                patches.append((pos + 8 + rng.randrange(n), bytes([rng.randrange(0x21, 0x7F)])))
        out.append(Mutation("value changes", f"{len(patches)} characters of {kv.key} changed", patches))

    # wrong counts: file-level counts and array lengths
    for what, pos in (("tensor count", 8), ("key/value count", 16)):
        (value,) = struct.unpack_from("<Q", source_header, pos)
        for v in (value + 1, value - 1, 0, *HUGE):
            out.append(Mutation("wrong counts", f"{what} {value} -> {v}", [(pos, _u64(v))]))
    for kv in [k for k in L.kvs if k.vtype == 9][:4]:
        for v in (kv.count + 1, kv.count - 1, 0, HUGE[1]):
            out.append(Mutation("wrong counts", f"{kv.key} length {kv.count} -> {v}", [(kv.value_pos + 4, _u64(v))]))

    # huge string lengths: keys, string values, array elements, tensor names
    lengths = [(f"key {kv.key}", kv.start) for kv in L.kvs[:3]] + \
              [(f"value of {kv.key}", kv.strings[0][0]) for kv in L.kvs if kv.vtype == 8][:3] + \
              [(f"element of {kv.key}", kv.strings[1][0]) for kv in L.kvs if kv.sub == 8 and len(kv.strings) > 1][:2] + \
              [(f"name of tensor {t.name}", t.start) for t in rng.sample(L.tensors, 3)]
    for what, pos in lengths:
        out.append(Mutation("huge string lengths", f"{what} length -> {HUGE[0]}", [(pos, _u64(rng.choice(HUGE)))]))
    out.append(Mutation("huge string lengths", "length just past the end",
                        [(L.kvs[1].start, _u64(L.size))]))

    # unknown value / element / tensor types and dimension counts
    for kv in L.kvs[:3] + [k for k in L.kvs if k.vtype == 9][:2]:
        for v in (13, 99, 1 << 31):
            out.append(Mutation("unknown types", f"{kv.key} value type {kv.vtype} -> {v}", [(kv.type_pos, _u32(v))]))
    for kv in [k for k in L.kvs if k.vtype == 9][:2]:
        for v in (9, 13):
            out.append(Mutation("unknown types", f"{kv.key} element type -> {v}", [(kv.value_pos, _u32(v))]))
    for t in rng.sample(L.tensors, 3):
        for v in (4, 31, 43, 99, 1 << 31):
            out.append(Mutation("unknown types", f"tensor {t.name} type -> {v}", [(t.type_pos, _u32(v))]))
        for v in (0, 5, 1 << 31):
            out.append(Mutation("unknown types", f"tensor {t.name} n_dims -> {v}", [(t.ndims_pos, _u32(v))]))
        for v in (0, 1 << 40):
            out.append(Mutation("unknown types", f"tensor {t.name} dim 0 -> {v}", [(t.dims_pos, _u64(v))]))

    # data offsets past the end of the file, misplaced or misaligned
    for t in rng.sample(L.tensors, 3) + [L.tensors[-1]]:
        for v in (L.size, L.size - L.data_start, 1 << 62, t.offset + 32, t.offset + 1):
            out.append(Mutation("offsets past the end", f"tensor {t.name} offset {t.offset} -> {v}",
                                [(t.offset_pos, _u64(v))]))
    return out


def hparam_mutations(layout: Layout, source_header: bytes, arch: str) -> list[Mutation]:
    """Values that are well-formed bytes but make llama.cpp assert while loading (or read out of bounds)."""
    out = []
    by_key = {kv.key: kv for kv in layout.kvs}
    for key, values in ((f"{arch}.block_count", (0, 513, 1 << 31)), (f"{arch}.embedding_length", (0,)),
                        (f"{arch}.expert_count", (2000,))):
        kv = by_key.get(key)
        if kv is not None and kv.vtype == 4:
            for v in values:
                out.append(Mutation("bad values", f"{key} -> {v}", [(kv.value_pos, _u32(v))]))
    kv = by_key.get("general.architecture")
    if kv is not None:
        out.append(Mutation("bad values", "architecture renamed", [(kv.strings[0][0] + 8, b"x")]))
    tokens = by_key.get("tokenizer.ggml.tokens")
    if tokens is not None:         # token 1 spelled like token 0 (same length): a duplicate vocabulary entry
        (p0, n0), (p1, n1) = tokens.strings[0], tokens.strings[1]
        if n0 == n1:
            out.append(Mutation("bad values", "duplicate token", [(p1 + 8, source_header[p0 + 8:p0 + 8 + n0])]))
        out.append(Mutation("bad values", "token 0 not UTF-8", [(p0 + 8, b"\xff")]))
    token_type = by_key.get("tokenizer.ggml.token_type")
    if token_type is not None:
        out.append(Mutation("bad values", "token types as uint8", [(token_type.value_pos, _u32(0))]))
    return out
