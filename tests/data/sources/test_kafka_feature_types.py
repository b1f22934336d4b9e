"""The Kafka JSON decoder takes what a source's columns declare: string or integer sparse ids, lists, weights.

Records are built the way the synthetic Kafka writer builds them (:func:`json_values`) and fed to the
decoder as raw record values; their canonical form (through the source's :class:`Normalizer`) must
equal what the same rows give when read from Parquet. One test does the broker round trip.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import pytest

from primus_dagster.data.canonical import Normalizer
from primus_dagster.data.hashing import stable_hash64
from primus_dagster.data.sources.kafka import decoding
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder, json_schema
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.sources import KafkaSourceSpec, SourceSpec
from primus_dagster.synth.realistic import RealisticWorld
from primus_dagster.synth.world import WorldConfig
from primus_dagster.synth.writers.kafka import json_values

H0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
H0_MS = int(H0.timestamp() * 1000)
REALISTIC = Path(__file__).resolve().parents[3] / "examples" / "realistic" / "job.yaml"
SPARSE = ["user_id", "item_id", "gender", "age_group", "country", "device"]


def realistic_sources() -> tuple[KafkaSourceSpec, SourceSpec]:
    """The realistic example's Kafka source and its Parquet source (the same column mapping)."""
    dataset = load_job_spec(REALISTIC).dataset
    kafka = dataset.source("events_kafka")
    assert isinstance(kafka, KafkaSourceSpec)
    return kafka, dataset.source("events_parquet")


def realistic_hour(rows: int = 600) -> pa.Table:
    """One hour of the realistic world's stream copy, as the writers get it (no ground-truth column)."""
    world = RealisticWorld(WorldConfig(seed=11, rows_per_hour=rows), H0)
    return world.stream_copy(world.hour(0)).drop_columns(["click_delay_s"])


def values_of(table: pa.Table) -> list[bytes | None]:
    """The Kafka record values the synthetic writer produces for ``table``."""
    return json_values(table).cast(pa.binary()).to_pylist()


def canonical(spec: SourceSpec, table: pa.Table) -> pa.Table:
    norm = Normalizer(spec)
    return pa.Table.from_batches([norm(b) for b in table.to_batches()])


def make_spec(**columns: Any) -> KafkaSourceSpec:
    return KafkaSourceSpec.model_validate(
        {
            "name": "s",
            "type": "kafka",
            "kind": "stream",
            "topic": "t",
            "columns": {"ts": "ts", "label": "y", "id": "id", "dense": ["d"], **columns},
        }
    )


def record(i: int, **fields: Any) -> bytes:
    return json.dumps({"id": i, "ts": H0_MS + i, "y": i % 2, "d": 0.5, **fields}).encode()


def decode(decoder: JsonRecordDecoder, values: list[bytes | None]) -> tuple[pa.Table, list[tuple[int, str]]]:
    table, bad = decoder.decode(values, [H0_MS] * len(values))
    assert table is not None
    return table, bad


def hashed(strings: list[str]) -> list[int]:
    return stable_hash64(pa.array(strings, pa.string())).to_pylist()


def test_realistic_stream_decodes_to_the_ids_parquet_gives(tmp_path: Path) -> None:
    kafka_spec, parquet_spec = realistic_sources()
    hour = realistic_hour()
    decoder = JsonRecordDecoder(kafka_spec)
    table, bad = decode(decoder, values_of(hour))
    assert not bad and table.num_rows == hour.num_rows
    assert decoder.id_kinds == dict.fromkeys([*SPARSE, "genres"], "string")
    assert table.schema.field("genres").type == pa.list_(pa.string())
    norm = Normalizer(kafka_spec)
    from_kafka = pa.Table.from_batches([norm(b) for b in table.to_batches()])
    assert norm.take() == {}  # nothing missing, nothing repaired

    for name in SPARSE:
        assert from_kafka.schema.field(name).type == pa.int64()
        assert from_kafka.column(name).to_pylist() == hashed(hour.column(name).to_pylist())
    assert from_kafka.schema.field("genres").type == pa.list_(pa.int64())
    assert from_kafka.column("genres").to_pylist() == [hashed(g) for g in hour.column("genres").to_pylist()]

    pq.write_table(hour, tmp_path / "hour.parquet")
    from_parquet = canonical(parquet_spec, pq.read_table(tmp_path / "hour.parquet"))
    for name in ["sample_id", "ts", "label", *SPARSE, "genres"]:
        assert from_kafka.column(name).equals(from_parquet.column(name)), name
    kafka_dense = np.asarray(from_kafka.column("dense").combine_chunks().flatten())
    parquet_dense = np.asarray(from_parquet.column("dense").combine_chunks().flatten())
    np.testing.assert_allclose(kafka_dense, parquet_dense, rtol=1e-6)


def test_integer_ids_keep_the_integer_schema_and_one_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec(sparse=["u"], lists=["tags"], weights={"tags": "tag_w"})
    assert json_schema(spec) == pa.schema(
        [
            ("ts", pa.int64()),
            ("y", pa.float64()),
            ("id", pa.int64()),
            ("d", pa.float32()),
            ("u", pa.int64()),
            ("tags", pa.list_(pa.int64())),
            ("tag_w", pa.list_(pa.float32())),
        ]
    )
    parses: list[str] = []
    read_json, read_ndjson = pj.read_json, pl.read_ndjson
    monkeypatch.setattr(decoding.pj, "read_json", lambda *a, **kw: parses.append("pyarrow") or read_json(*a, **kw))
    monkeypatch.setattr(pl, "read_ndjson", lambda *a, **kw: parses.append("polars") or read_ndjson(*a, **kw))
    decoder = JsonRecordDecoder(spec)
    values: list[bytes | None] = [record(i, u=i * 7, tags=[i, i + 1], tag_w=[1, 0.5]) for i in range(40)]
    table, bad = decode(decoder, values)
    assert not bad and parses == ["polars"]  # the integer path: one bulk parse (the fast path), no rewrite
    assert table.schema == decoder.schema and decoder.id_kinds == {"u": "int", "tags": "int"}
    out = canonical(spec, table)
    assert out.column("u").to_pylist() == [i * 7 for i in range(40)]
    assert out.column("tags").to_pylist() == [[i, i + 1] for i in range(40)]
    assert out.column("tags.weights").to_pylist() == [[1.0, 0.5]] * 40


def test_a_field_mixing_ints_and_strings_keeps_each_values_type() -> None:
    spec = make_spec(sparse=["u"], lists=["tags"])
    ints = [record(i, u=i, tags=[i, 100 + i]) for i in range(10)]
    strings = [record(10 + i, u=f"user-{i}", tags=[f"t{i}", "x"]) for i in range(10)]
    mixed = [v for pair in zip(ints, strings, strict=True) for v in pair]
    want_u = [v for pair in zip(range(10), hashed([f"user-{i}" for i in range(10)]), strict=True) for v in pair]
    want_tags = [
        v
        for pair in zip([[i, 100 + i] for i in range(10)], [hashed([f"t{i}", "x"]) for i in range(10)], strict=True)
        for v in pair
    ]

    in_one_chunk = JsonRecordDecoder(spec)
    table, bad = decode(in_one_chunk, mixed)
    assert not bad and in_one_chunk.id_kinds == {"u": "mixed", "tags": "mixed"}
    out = canonical(spec, table)
    assert out.column("u").to_pylist() == want_u
    assert out.column("tags").to_pylist() == want_tags

    # Chunk by chunk (ints, then strings, then ints again): the same ids whichever chunk a value is in.
    chunked = JsonRecordDecoder(spec)
    got_u: dict[int, int] = {}
    for chunk in (ints[:5], strings[:5], ints[5:], strings[5:]):
        part = canonical(spec, decode(chunked, chunk)[0])
        got_u.update(zip(part.column("sample_id").to_pylist(), part.column("u").to_pylist(), strict=True))
    assert [got_u[i] for i in [v for pair in zip(range(10), range(10, 20), strict=True) for v in pair]] == want_u
    assert decode(chunked, mixed)[0].column("u").type == pa.int64()  # the merged ids, strings hashed

    # A list holding both, a float or a boolean id: undecodable records, the rest decode.
    odd = [*mixed[:3], record(90, u=1, tags=[1, "a"]), record(91, u=1.5), record(92, u=True), b"{nope", *mixed[3:]]
    table, bad = decode(JsonRecordDecoder(spec), odd)
    assert [i for i, _ in bad] == [3, 4, 5, 6]
    assert canonical(spec, table).column("u").to_pylist() == want_u


def test_string_ids_of_an_integer_topic_switch_the_field_for_good() -> None:
    spec = make_spec(sparse=["u"])
    decoder = JsonRecordDecoder(spec)
    decode(decoder, [record(i, u=i) for i in range(5)])
    assert decoder.id_kinds == {"u": "int"}
    table, _ = decode(decoder, [record(i, u=f"s{i}") for i in range(5)])
    assert decoder.id_kinds == {"u": "string"} and table.column("u").type == pa.string()
    assert canonical(spec, table).column("u").to_pylist() == hashed([f"s{i}" for i in range(5)])
    decode(decoder, [record(i, u=i) for i in range(5)])  # back to ints: switched twice, now mixed
    assert decoder.id_kinds == {"u": "mixed"}

    # A bad record first: the halves are parsed apart (ints, then strings) and joined as int64 ids.
    values = [b"{nope}", *[record(i, u=i) for i in range(7)], *[record(10 + i, u=f"s{i}") for i in range(8)]]
    decoder = JsonRecordDecoder(spec)
    table, bad = decode(decoder, values)
    assert [i for i, _ in bad] == [0] and decoder.id_kinds == {"u": "string"}
    assert table.column("u").type == pa.int64()
    assert canonical(spec, table).column("u").to_pylist() == [*range(7), *hashed([f"s{i}" for i in range(8)])]


def test_missing_fields_follow_the_quality_rules() -> None:
    spec = make_spec(sparse=["u"], lists=["tags"])
    values: list[bytes | None] = [
        record(0, u="a", tags=["x"]),
        record(1, tags=["y"]),  # no sparse id: missing_field, repaired to 0
        record(2, u=None, tags=["y"]),  # null is missing too
        record(3, u="b"),  # no list: no id (an empty list), as a null list is everywhere
        record(4, u="c", tags=None),
        record(5, u="d", tags=[]),
    ]
    table, bad = decode(JsonRecordDecoder(spec), values)
    assert not bad
    norm = Normalizer(spec)
    out = norm(table.to_batches()[0])
    assert out.column("u").to_pylist() == [hashed(["a"])[0], 0, 0, *hashed(["b", "c", "d"])]
    assert out.column("tags").to_pylist() == [hashed(["x"]), hashed(["y"]), hashed(["y"]), [], [], []]
    assert norm.take() == {"missing_field": 2}


def test_weights_are_float_lists_filled_when_missing() -> None:
    spec = make_spec(lists={"genres": "g"}, weights={"genres": "gw"})
    values: list[bytes | None] = [
        record(0, g=["a", "b"], gw=[0.25, 2]),
        record(1, g=["a"]),  # no weights: 1 per id
        record(2, g=["a", "b"], gw=[1.0]),  # lengths differ: undecodable
        record(3),  # neither: no id
        record(4, gw=[0.5]),  # weights without ids: undecodable
        record(5, g=["c"], gw=None),
    ]
    table, bad = decode(JsonRecordDecoder(spec), values)
    assert [i for i, _ in bad] == [2, 4] and "differ in length" in bad[0][1]
    assert table.schema.field("gw").type == pa.list_(pa.float32())
    out = canonical(spec, table)
    assert out.column("sample_id").to_pylist() == [0, 1, 3, 5]
    assert out.column("genres").to_pylist() == [hashed(["a", "b"]), hashed(["a"]), [], hashed(["c"])]
    assert out.column("genres.weights").to_pylist() == [[0.25, 2.0], [1.0], [], [1.0]]


def test_ts_is_filled_after_dropping_bad_weights_rows() -> None:
    spec = make_spec(lists=["g"], weights={"g": "gw"})
    values: list[bytes | None] = [
        json.dumps({"id": i, "y": 0, "d": 0.5, "g": [i], "gw": [1.0] * (1 + (i == 1))}).encode() for i in range(4)
    ]
    table, bad = JsonRecordDecoder(spec).decode(values, [H0_MS + 10 * i for i in range(4)])
    assert [i for i, _ in bad] == [1] and table is not None
    assert table.column("ts").to_pylist() == [H0_MS, H0_MS + 20, H0_MS + 30]


@pytest.mark.integration
def test_the_realistic_stream_round_trips_through_the_broker(kafka_broker: Any) -> None:
    from primus_dagster.data.sources.base import SourceContext
    from primus_dagster.data.sources.kafka import KafkaSource
    from primus_dagster.synth.writers.kafka import KafkaWriter

    kafka_spec, _ = realistic_sources()
    spec = kafka_spec.model_copy(update={"topic": f"realistic-{uuid.uuid4().hex[:8]}"})
    context = SourceContext(kafka_bootstrap_servers=kafka_broker.bootstrap_servers)
    hour = realistic_hour(300)
    writer = KafkaWriter(spec, context, partitions=2)
    try:
        writer.write_hour(H0, hour)
    finally:
        writer.close()
    with KafkaSource(spec, context) as src:
        got = pa.Table.from_batches([b for t in src.split(src.partition(H0)) for b in src.read(t)])
        assert src.stats["bad_records"] == 0
    want = canonical(kafka_spec, hour).sort_by("sample_id")
    got = got.sort_by("sample_id")
    for name in ["sample_id", "ts", "label", *SPARSE, "genres"]:
        assert got.column(name).equals(want.column(name)), name


def test_string_labels_decode_through_label_positive() -> None:
    """A team's stream whose label is text (">50K" / "<=50K"): with `label_positive` the decoder takes the
    field as a string and the normaliser makes that value 1, every other 0; without
    it every record is undecodable, its reason naming the field and the key that fixes it."""
    spec = make_spec(label_positive=">50K")
    values: list[bytes | None] = [
        record(0, y=">50K"),
        record(1, y="<=50K"),
        record(2, y=" >50K "),  # surrounding whitespace trimmed
        record(3, y=None),
    ]
    table, bad = decode(JsonRecordDecoder(spec), values)
    assert not bad
    out = Normalizer(spec)(table.to_batches()[0])
    # a missing label: the stream's null_label rule repairs it to 0 (a negative until corrected)
    assert out.column("label").to_pylist() == [1.0, 0.0, 1.0, 0.0]
    # without it: each record undecodable (counted, never fatal), the reason naming the field and the key
    nothing, bad = JsonRecordDecoder(make_spec()).decode(values[:2], [H0_MS] * 2)
    assert nothing is None and [i for i, _ in bad] == [0, 1]
    assert all(
        "label field 'y' holds text" in why and "columns.label_positive: '<that value>'" in why for _, why in bad
    )
