"""The one stable hash of categorical values that are not integers (string, binary, dictionary ids).

A string id (``"user-42"``, a country code, a genre) becomes an int64 id by **FNV-1a 64** of its bytes
(UTF-8 for strings): ``h = 0xcbf29ce484222325``; for each byte ``b``: ``h = (h ^ b) * 0x100000001b3 mod
2**64``; the result read as a two's-complement int64. It depends on nothing but the bytes, so the same
value gets the same id in every process, run, machine and language; the model then hashes the id into
its embedding buckets as it does any integer id. Nulls stay null.

Why written here and not taken from a library: Arrow has no public hash kernel, and per-value hashing in
Python is what a library would cost here -- measured on high-cardinality strings (``user-<7 digits>``):
``hashlib.blake2b`` over the distinct values was the slowest, pandas' ``hash_array`` (SipHash) next, and
this vectorised FNV-1a (one numpy pass per byte position over the values still that long) an order of
magnitude faster than either (figures in docs/data_plane.md, "Measured reasons in the code").

Example::

    >>> import pyarrow as pa
    >>> stable_hash64(pa.array(["a", None, "a"])).to_pylist()
    [-5808556873153909620, None, -5808556873153909620]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FNV_OFFSET_BASIS = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def is_hashable_category(kind: pa.DataType) -> bool:
    """True for the types :func:`stable_hash64` takes: strings, binaries, dictionaries of them."""
    if pa.types.is_dictionary(kind):
        return is_hashable_category(kind.value_type)
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or (pa.types.is_large_binary(kind))
    )


def stable_hash64(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """FNV-1a 64 of each value's bytes as int64 (module docstring); nulls stay null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):  # hash the distinct values once, then look them up
        hashed = stable_hash64(values.dictionary).to_numpy(zero_copy_only=False)
        if not len(hashed):  # only nulls: nothing to look up
            hashed = np.zeros(1, np.int64)
        indices = values.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return pa.array(hashed[indices], pa.int64(), mask=_nulls(values))
    if not is_hashable_category(values.type):
        raise TypeError(f"stable_hash64 takes strings or binaries, not {values.type}")
    binary = pc.cast(values, pa.large_binary())  # the same bytes, int64 offsets
    n = len(binary)
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64)[binary.offset : binary.offset + n + 1]
    data_buffer = binary.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")  # longest first: the values still going are a prefix
    starts, lengths = starts[order], lengths[order]
    h = np.full(n, FNV_OFFSET_BASIS, dtype=np.uint64)
    longest = int(lengths[0]) if n else 0
    # How many values are longer than j, for every byte position j (lengths are sorted descending).
    going = np.searchsorted(-lengths, -np.arange(longest), side="left") if longest else np.zeros(0, np.int64)
    with np.errstate(over="ignore"):  # multiplication modulo 2**64 is the point
        for j in range(longest):
            k = int(going[j])
            h[:k] = (h[:k] ^ data[starts[:k] + j].astype(np.uint64)) * FNV_PRIME
    out = np.empty(n, dtype=np.uint64)
    out[order] = h
    return pa.array(out.view(np.int64), pa.int64(), mask=_nulls(values))


def _nulls(values: pa.Array) -> np.ndarray | None:
    return values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
