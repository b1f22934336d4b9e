"""The Kafka JSON decoder's polars fast path against its reference, the ``pyarrow.json`` path.

The rule under test: whatever chunk the fast path reads, the decoder's answer (table and undecodable
records) is exactly the ``pyarrow.json`` path's; every chunk it cannot vouch for -- duplicate keys, lone
surrogate escapes, values pyarrow accepts and polars refuses (``NaN``, invalid UTF-8 in an unmapped
field, deep nesting), any undecodable record, polars itself failing -- goes to the pyarrow path, which alone
decides what is undecodable. Each case is run through a decoder with the fast path and one without
(``fast=False``) and the answers compared; a byte-level fuzz does the same on mutated records.
"""

from __future__ import annotations

import gc
import json
import threading
import uuid
from datetime import datetime, timezone
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kafka_feature_types import make_spec as feature_spec

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.data.sources.kafka import FETCHERS, KafkaSource
from primus_dagster.data.sources.kafka.adapter import Fetcher
from primus_dagster.data.sources.kafka.clients import ConfluentClient, GcPause
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder
from primus_dagster.data.sources.kafka.polars_json import MAX_PAUSE, PolarsJsonReader, count_byte, float32_midpoints
from primus_dagster.devtools.kafka_broker import EmbeddedBroker, create_topic
from primus_dagster.spec.sources import KafkaSourceSpec

H0_MS = int(datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp() * 1000)


def make_spec(**columns: Any) -> KafkaSourceSpec:
    """The feature-type tests' source (ts, label ``y``, id), with two dense fields, an id, an id list and its weights."""
    return feature_spec(
        **{"dense": ["d0", "d1"], "sparse": ["u"], "lists": ["tags"], "weights": {"tags": "tag_w"}, **columns}
    )


SPEC = make_spec()


def row(i: int, **fields: Any) -> dict[str, Any]:
    """One record of :data:`SPEC` with every mapped field (floats of many magnitudes, int64 extremes)."""
    rng = np.random.default_rng(i)
    return {
        "id": {19: -(2**63), 29: 2**63 - 1}.get(i, i),
        "ts": H0_MS + i,
        "y": i % 2,
        "d0": float(rng.standard_normal()) * 10.0 ** int(rng.integers(-30, 30)),
        "d1": float(np.float32(rng.standard_normal())),
        "u": int(rng.integers(-(10**12), 10**12)),
        "tags": [int(t) for t in rng.integers(0, 100, i % 4)],
        "tag_w": [0.5] * (i % 4),
        **fields,
    }


def compact(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


GOOD = [compact(row(i)) for i in range(40)]


def both(values: list[bytes | None], spec: KafkaSourceSpec = SPEC) -> tuple[JsonRecordDecoder, Any, Any]:
    """The fast decoder (after decoding ``values``), its answer and the reference answer, checked equal."""
    fast, reference = JsonRecordDecoder(spec), JsonRecordDecoder(spec, fast=False)
    stamps = [H0_MS + 1000 + i for i in range(len(values))]
    got, want = fast.decode(values, stamps), reference.decode(values, stamps)
    assert got[1] == want[1]
    assert (got[0] is None) == (want[0] is None)
    if want[0] is not None:  # the same schema, layout and values (NaN equal to NaN, -0.0 apart from 0.0)
        assert got[0].schema == want[0].schema
        assert [c.num_chunks for c in got[0].columns] == [c.num_chunks for c in want[0].columns]
        assert repr(got[0].to_pylist()) == repr(want[0].to_pylist())
    assert reference.fast_stats == {"read": 0, "declined": 0, "skipped": 0}
    return fast, got, want


def test_a_clean_chunk_is_read_by_polars_exactly_as_pyarrow_reads_it() -> None:
    values: list[bytes | None] = [
        *GOOD,
        compact({"id": 100, "ts": H0_MS}),  # missing fields: nulls, as pyarrow gives
        compact({**row(101), "tags": [], "tag_w": []}),
        json.dumps(row(102)).encode(),  # with spaces
        b'{ "id" : 103 ,\t"y" : 1e0 , "d0" : -0.0 , "d1" : 1E+2 , "ts" : 5 }',
        compact({**row(104), "d0": 33554435, "y": 9007199254740993}),  # float32 / float64 rounding of integers
    ]
    decoder, (table, bad), _ = both(values)
    assert decoder.fast_stats == {"read": 1, "declined": 0, "skipped": 0}
    assert not bad and table.num_rows == len(values)
    assert table.column("id").to_pylist()[18:30:10] == [18, 28] and table.column("id")[19:30:10].to_pylist() == [
        -(2**63),
        2**63 - 1,
    ]


def test_unmapped_fields_and_a_mapped_name_as_a_value_still_take_the_fast_path() -> None:
    extra = {"url": "https://x.test:8080/a?b=c:d", "note": "id", "n": 3, "flag": True, "nothing": None, "empty": {}}
    values: list[bytes | None] = [compact({**row(i), **extra}) for i in range(30)]
    decoder, (table, bad), _ = both(values)
    assert decoder.fast_stats["read"] == 1 and not bad and table.num_rows == 30


ODD: dict[str, bytes] = {
    # undecodable for pyarrow: counted, the rest of the chunk decodes
    "duplicate key": b'{"id":1,"id":2,"ts":1}',
    "duplicate key, the second null": b'{"id":1,"ts":1,"d0":0.5,"d0":null}',
    "duplicate key, escaped": b'{"id":1,"\\u0069d":2,"ts":1}',
    "lone surrogate in an unmapped field": b'{"id":1,"ts":1,"name":"\\ud800"}',
    "string in an int field": b'{"id":"7","ts":1}',
    "float in an int field": b'{"id":1.5,"ts":1}',
    "integral float in an int field": b'{"id":1.0,"ts":1}',
    "boolean in a float field": b'{"id":1,"ts":1,"d0":true}',
    "object in an int field": b'{"id":{"a":1},"ts":1}',
    "int past int64": b'{"id":9223372036854775808,"ts":1}',
    "string in an id list": b'{"id":1,"ts":1,"tags":[1,"a"]}',
    "number for a list": b'{"id":1,"ts":1,"tags":5}',
    "two objects in one value": b'{"id":1,"ts":1}{"id":2,"ts":2}',
    "truncated": b'{"id":1,"ts":',
    "trailing comma": b'{"id":1,"ts":1,}',
    "exponent too big": b'{"id":1,"ts":1,"d0":1e400}',
    # decodable for pyarrow but refused by polars or its checks: the pyarrow path decodes them
    "explicit null": b'{"id":1,"ts":1,"d0":null}',
    "-0 in a float field": b'{"id":1,"ts":1,"y":0,"d0":-0}',
    "-0 in a float list": b'{"id":1,"ts":1,"y":0,"tags":[1],"tag_w":[-0]}',
    "a float32 midpoint": b'{"id":1,"ts":1,"d0":16777217}',
    "a float32 midpoint written long": b'{"id":1,"ts":1,"d1":1.000000059604644775390625}',
    "near a float32 midpoint": b'{"id":1,"ts":1,"d1":1.0000000596046447753906250000000001}',
    "at the float32 overflow threshold": b'{"id":1,"ts":1,"d0":340282356779733661637539395458142568448}',
    "NaN in a float field": b'{"id":1,"ts":1,"d0":NaN}',
    "Infinity in an unmapped field": b'{"id":1,"ts":1,"x":-Infinity}',
    "invalid UTF-8 in an unmapped field": b'{"id":1,"ts":1,"x":"\xff"}',
    "escaped key": b'{"\\u0069d":1,"ts":1}',
    "unicode escape in a value": b'{"id":1,"ts":1,"x":"caf\\u00e9"}',
    "a mapped name in a nested object": b'{"id":1,"ts":1,"meta":{"id":5}}',
    "deep nesting": b'{"id":1,"ts":1,"x":' + b"[" * 1500 + b"]" * 1500 + b"}",
    # not one clean line: the per-record path, as before
    "leading space": b' {"id":1,"ts":1}',
    "pretty-printed": b'{\n  "id": 1,\n  "ts": 1\n}',
    "byte order mark": b'\xef\xbb\xbf{"id":1,"ts":1}',
    "not an object": b"[1, 2]",
    "empty": b"",
}


@pytest.mark.parametrize("case", list(ODD))
def test_what_the_fast_path_cannot_vouch_for_is_decided_by_pyarrow(case: str) -> None:
    values: list[bytes | None] = [*GOOD[:20], ODD[case], *GOOD[20:]]
    decoder, (table, bad), _ = both(values)
    assert decoder.fast_stats["read"] == 0  # declined, or never asked (not a clean chunk)
    assert table is not None and table.num_rows + len(bad) == len(values)


NUMBERS = [
    "0e0", "-0", "1E-0", "1e-45", "1e-46", "3.4028235e38", "3.4028236e38", "4e38", "1.7976931348623157e308",
    "123456789012345678901234567890", "1" + "0" * 60, "0.000000000000000000000000000001", "2.5e-324",
    "0.1000000000000000055511151231257827", "16777216.5", "-9223372036854775808", "9223372036854775807",
]  # fmt: skip


@pytest.mark.parametrize("number", NUMBERS)
def test_numbers_in_every_numeric_column_read_as_pyarrow_reads_them(number: str) -> None:
    """The same bits whichever path reads them (or both refuse: an undecodable record either way)."""
    for field in ("d0", "y", "u", "tags", "tag_w"):
        value = f"[{number}]" if field in ("tags", "tag_w") else number
        record = compact({k: v for k, v in row(3).items() if k != field})[:-1] + f',"{field}":{value}}}'.encode()
        both([*GOOD[:5], record, *GOOD[5:10]])


def test_weights_of_another_length_are_found_after_either_parse() -> None:
    values: list[bytes | None] = [*GOOD[:20], b'{"id":1,"ts":1,"tags":[1,2],"tag_w":[1.0]}', *GOOD[20:]]
    decoder, (_, bad), _ = both(values)
    assert decoder.fast_stats["read"] == 1 and [i for i, _ in bad] == [20]


def test_a_tombstone_takes_the_per_record_path() -> None:
    decoder, (_, bad), _ = both([*GOOD[:5], None, *GOOD[5:10]])
    assert [i for i, _ in bad] == [5] and decoder.fast_stats["read"] == 0


def test_string_ids_and_a_dense_list_column() -> None:
    """A string id switches the field (pyarrow decides); the fast path is then out (a string column)."""
    values: list[bytes | None] = [*GOOD[:10], compact({**row(10), "u": "user-10"})]
    decoder, _, _ = both(values)
    assert decoder.id_kinds["u"] == "mixed" and decoder.fast_stats == {"read": 0, "declined": 0, "skipped": 0}
    decoder.decode(list(GOOD), [H0_MS] * len(GOOD))
    assert decoder.fast_stats == {"read": 0, "declined": 0, "skipped": 0}
    listed = make_spec(dense="emb")
    records = [compact({"id": i, "ts": H0_MS + i, "y": 0, "emb": [0.1 * i, -i, 1e-40]}) for i in range(20)]
    decoder, (table, bad), _ = both(records, listed)
    assert decoder.fast_stats["read"] == 1 and not bad
    assert table.schema.field("emb").type == pa.list_(pa.float32())


def test_a_declined_chunk_pauses_the_fast_path_doubling_up_to_a_limit() -> None:
    reader = PolarsJsonReader.for_schema(pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    assert reader is not None
    good, dup = b'{"id":1,"x":0.5}\n{"id":2}', b'{"id":1,"id":2}\n{"id":2}'

    def pause_after_a_decline() -> int:
        """Decline a chunk, then count the chunks left to pyarrow unasked."""
        assert reader.read(dup, 2) is None
        skipped = 0
        while reader._pause:
            assert reader.read(good, 2) is None
            skipped += 1
        return skipped

    assert reader.read(good, 2) is not None
    assert [pause_after_a_decline() for _ in range(9)] == [1, 2, 4, 8, 16, 32, MAX_PAUSE, MAX_PAUSE, MAX_PAUSE]
    assert reader.read(good, 2) is not None  # read again: the next pause starts at 1
    assert pause_after_a_decline() == 1
    assert reader.stats == {"read": 2, "declined": 10, "skipped": 1 + 2 + 4 + 8 + 16 + 32 + 3 * MAX_PAUSE + 1}


@pytest.mark.parametrize(
    "fault",
    [
        pl.exceptions.PanicException("injected panic"),
        pl.exceptions.ComputeError("injected"),
        MemoryError("injected"),
        "short",
    ],
    ids=["panic", "compute-error", "memory-error", "fewer-rows"],
)
def test_polars_failing_leaves_the_chunk_to_pyarrow(monkeypatch: pytest.MonkeyPatch, fault: Any) -> None:
    read_ndjson = pl.read_ndjson

    def failing(source: bytes, **kw: Any) -> pl.DataFrame:
        if fault == "short":
            return read_ndjson(source, **kw).head(3)
        raise fault

    monkeypatch.setattr(pl, "read_ndjson", failing)
    decoder, (table, bad), (want, _) = both(list(GOOD))
    assert decoder.fast_stats == {"read": 0, "declined": 1, "skipped": 0}
    assert not bad and table.equals(want)


def test_names_that_could_be_escaped_keep_the_pyarrow_path() -> None:
    assert PolarsJsonReader.for_schema(pa.schema([("a/b", pa.int64())])) is None
    assert PolarsJsonReader.for_schema(pa.schema([('a"b', pa.int64())])) is None
    assert PolarsJsonReader.for_schema(pa.schema([("a", pa.string())])) is None
    odd = PolarsJsonReader.for_schema(pa.schema([("a.b c-d", pa.int64()), ("é", pa.int64())]))
    assert odd is not None  # regex metacharacters and non-ASCII names are counted literally
    assert odd.read(b'{"a.b c-d":1,"\xc3\xa9":2,"z":"a:b"}\n{"a.b c-d" : 3}', 2) is not None
    assert odd.read(b'{"a.b c-d":1,"a.b c-d":2,"z":"a:b"}\n{"a.b c-d" : 3}', 2) is None


def test_float32_midpoints_are_found_exactly() -> None:
    one, sub = np.float32(1.0), np.float32(2.0**-140)  # a normal float32 and a subnormal one
    halfway = [
        (float(one) + float(np.nextafter(one, np.float32(2)))) / 2,
        (float(sub) + float(np.nextafter(sub, np.float32(1)))) / 2,
        2.0**-150,  # between 0 and the smallest subnormal
        -(2.0**128 - 2.0**103),  # the overflow threshold
        16777217.0,
    ]
    for value in halfway:
        assert float32_midpoints(np.array([0.5, value]))
    others = [0.0, -0.0, 1.0, 0.1, float(np.nextafter(halfway[0], 2)), 2.0**-160, 3e38, np.inf, np.nan, 2.0**-149]
    assert not float32_midpoints(np.array(others))


@pytest.mark.parametrize("block", [1, 7, 1 << 18])
def test_count_byte_counts_across_blocks(block: int) -> None:
    text = bytes(np.random.default_rng(block).integers(0, 4, 1000, dtype=np.uint8) + ord(":"))
    assert count_byte(text, ord(":"), block) == text.count(b":") and count_byte(b"", 0x3A) == 0


# -- a byte-level fuzz: mutated records, the fast decoder's answer always the reference's ------------------

_ALPHABET = b'{}[]":,. -+0123456789eEnulltrufas\\\\u0069dyx\xff\x00\t'


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.integers(0, 39),
    edits=st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 3), st.sampled_from(list(_ALPHABET))), min_size=1, max_size=4
    ),
    spaced=st.booleans(),
)
def test_fuzzed_records_decode_as_the_reference_decodes_them(
    base: int, edits: list[tuple[int, int, int]], spaced: bool
) -> None:
    record = bytearray(json.dumps(row(base)).encode() if spaced else GOOD[base])
    for at, op, byte in edits:
        at %= len(record) + 1
        if op == 0:
            record.insert(at, byte)
        elif op == 1 and record:
            del record[min(at, len(record) - 1)]
        elif record:
            record[min(at, len(record) - 1)] = byte
    both([*GOOD[:8], bytes(record), *GOOD[8:16]])


# -- the collector pause the readers take records out under ------------------------------------------------


def test_the_gc_pause_nests_across_threads_and_keeps_a_callers_choice() -> None:
    pause = GcPause()
    assert gc.isenabled()
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with pause.paused():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=other)
    with pause.paused():
        thread.start()
        inside.wait(5)
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    thread.join(5)
    assert gc.isenabled()
    gc.disable()
    try:
        with pause.paused():
            pass
        assert not gc.isenabled()  # a caller's gc.disable() is kept
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), pause.paused():
        raise RuntimeError("a failing fetch")
    assert gc.isenabled()


# -- through the broker: the same batches and counts with and without the fast path, on both clients --------


class _GcSpy:
    """A consumer whose reads (``consume``, ``poll``) record whether Python's collector was enabled."""

    def __init__(self, consumer: Any, seen: list[bool]) -> None:
        self._consumer, self._seen = consumer, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        self._seen.append(gc.isenabled())
        return self._consumer.consume(*args, **kwargs)

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        self._seen.append(gc.isenabled())
        return self._consumer.poll(*args, **kwargs)


@pytest.fixture(scope="module")
def topic(kafka_broker: EmbeddedBroker) -> dict[str, Any]:
    """400 records of :data:`SPEC` in an hour, one partition; three the fast path cannot vouch for (at offsets
    100, 250 and 390: a duplicate key, a NaN, a lone surrogate escape)."""
    from kafka import KafkaProducer

    name = f"fast-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, name, 1)
    odd = {100: ODD["duplicate key"], 250: ODD["NaN in a float field"], 390: ODD["lone surrogate in an unmapped field"]}
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, linger_ms=5)
    for i in range(400):
        value = odd.get(i, compact(row(i)))
        producer.send(name, value, partition=0, timestamp_ms=H0_MS + i * 1000)
    producer.send(name, compact(row(400, ts=H0_MS + 3_600_000)), partition=0, timestamp_ms=H0_MS + 3_600_000)
    producer.flush()
    producer.close()
    return {"name": name, "bootstrap": kafka_broker.bootstrap_servers}


@pytest.mark.integration
@pytest.mark.parametrize("fetcher", FETCHERS)
def test_reads_through_the_broker_match_the_pyarrow_path(
    topic: dict[str, Any], fetcher: Fetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SPEC.model_copy(update={"topic": topic["name"], "batch_rows": 32})
    context = SourceContext(kafka_bootstrap_servers=topic["bootstrap"])
    hour = datetime.fromtimestamp(H0_MS / 1000, timezone.utc)
    got: dict[str, Any] = {}
    seen: list[bool] = []
    for fast in (True, False):
        with KafkaSource(spec, context, fetcher=fetcher) as src:
            src._decoder = JsonRecordDecoder(spec, fast=fast)
            make = src._read_client

            def spied(make: Any = make) -> Any:
                client = make()
                if isinstance(client, ConfluentClient):
                    client.consumer = _GcSpy(client.consumer, seen)
                    return client
                return _GcSpy(client, seen)

            monkeypatch.setattr(src, "_read_client", spied)
            tasks = src.split(src.partition(hour))
            batches = [b for t in tasks for b in src.read(t)]
            got[str(fast)] = ([b.to_pydict() for b in batches], dict(src.stats), src.last_read_stats["bad_examples"])
            if fast:  # 13 chunks of 32: 3 declined, 2 left to pyarrow while paused, the rest read by polars
                assert src._decoder.fast_stats == {"read": 8, "declined": 3, "skipped": 2}
            assert src.stats["bad_records"] == 2 and src.stats["rows"] == 398  # the NaN record decodes
    assert repr(got["True"]) == repr(got["False"])  # repr: the NaN record's NaN equal to itself
    assert [e["offset"] for e in got["True"][2]] == [100, 390]
    assert seen and not any(seen)  # every read with the collector paused
    assert gc.isenabled()
