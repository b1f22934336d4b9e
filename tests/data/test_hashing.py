"""The stable hash of string ids: FNV-1a 64 of the bytes, the same as a byte-by-byte reference for any
value (and through dictionaries, slices and chunks), nulls kept."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_dagster.data.hashing import stable_hash64


def reference(value: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in value:
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return h - 2**64 if h >= 2**63 else h


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=60), st.integers(0, 5))
def test_it_is_fnv1a_of_the_utf8_bytes_whatever_the_layout(values: list[str | None], cut: int) -> None:
    expected = [None if v is None else reference(v.encode()) for v in values]
    plain = pa.array(values, pa.string())
    assert stable_hash64(plain).to_pylist() == expected
    assert stable_hash64(plain.cast(pa.large_string())).to_pylist() == expected
    assert stable_hash64(plain.dictionary_encode()).to_pylist() == expected
    assert stable_hash64(plain[cut:]).to_pylist() == expected[cut:]
    assert stable_hash64(pa.chunked_array([plain[:cut], plain[cut:]], pa.string())).to_pylist() == expected


def test_binary_values_and_a_known_value() -> None:
    assert stable_hash64(pa.array([b"\x00\xff"], pa.binary())).to_pylist() == [reference(b"\x00\xff")]
    assert stable_hash64(pa.array(["a"])).to_pylist() == [0xAF63DC4C8601EC8C - 2**64]  # FNV-1a 64("a")


def test_other_types_are_refused() -> None:
    with pytest.raises(TypeError, match="strings or binaries, not int64"):
        stable_hash64(pa.array([1, 2]))
