"""Avro record values (``format: avro``): the decoder, the spec keys, reads over the embedded broker, training.

The schema registry is :class:`registry_testkit.TestRegistry`, a stand-in HTTP server (no Confluent Schema
Registry can be installed here); the records are real Confluent-framed Avro (fastavro) on the embedded
tansu broker. Unit tests first (the decoder and the spec), then the integration tests (marked).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from registry_testkit import TestRegistry, avro_body, framed, produce_avro

from primus_dagster.data.canonical import SchemaMismatchError
from primus_dagster.data.hashing import stable_hash64
from primus_dagster.data.sources.base import SourceContext, SourceReadError, TimeWindow
from primus_dagster.data.sources.kafka import AvroRecordDecoder, JsonRecordDecoder, KafkaSource, SchemaRegistryError
from primus_dagster.data.sources.kafka.decoding import hashed_ids
from primus_dagster.devtools.kafka_broker import EmbeddedBroker, create_topic
from primus_dagster.spec.sources import KafkaSourceSpec

COLUMNS = {
    "ts": "event_time",
    "label": "click",
    "id": "sample_id",
    "dense": ["d0", "d1"],
    "sparse": ["user_id", "item_id"],
    "lists": ["tags"],
    "weights": {"tags": "tags_w"},
}
SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "event_time", "type": ["null", "long"], "default": None},
        {"name": "click", "type": ["null", "int"], "default": None},
        {"name": "sample_id", "type": "long"},
        {"name": "d0", "type": "double"},
        {"name": "d1", "type": ["null", "float"], "default": None},
        {"name": "user_id", "type": "string"},
        {"name": "item_id", "type": ["long", "string"]},
        {"name": "tags", "type": ["null", {"type": "array", "items": "string"}], "default": None},
        {"name": "tags_w", "type": ["null", {"type": "array", "items": "float"}], "default": None},
        {"name": "unmapped", "type": {"type": "map", "values": "long"}, "default": {}},
    ],
}


def spec(**extra: Any) -> KafkaSourceSpec:
    keys = {"format": "avro", **extra}
    if "avro_schema" not in keys and "schema_registry_url" not in keys:
        keys["avro_schema"] = SCHEMA
    return KafkaSourceSpec.model_validate(
        {"name": "events", "type": "kafka", "kind": "stream", "topic": "t", "columns": COLUMNS, **keys}
    )


def record(i: int, ts: int | None = None) -> dict[str, Any]:
    return {
        "event_time": ts if ts is not None else (None if i % 5 == 0 else 1_000 + i),
        "click": None if i % 7 == 3 else i % 2,
        "sample_id": i,
        "d0": i / 2,
        "d1": None if i % 3 == 0 else float(i),
        "user_id": f"u{i % 4}",
        "item_id": i if i % 2 else f"item-{i}",
        "tags": None if i % 6 == 1 else [f"t{i % 3}", "common"][: 1 + i % 2],
        "tags_w": [0.5, 2.0][: 1 + i % 2] if i % 4 == 2 else None,
        "unmapped": {"x": i},
    }


def as_json(rec: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in rec.items() if v is not None}).encode()


# -- the decoder -----------------------------------------------------------------------------------------


def test_plain_avro_decodes_to_the_json_decoders_columns_and_ids() -> None:
    """Same values, same table: types, string ids hashed as the JSON path hashes them, mixed int/string ids,
    lists, missing weights filled, nulls kept, a missing ts filled from the record timestamp."""
    records = [record(i) for i in range(40)]
    stamps = [500 + i for i in range(40)]
    table, bad = AvroRecordDecoder(spec()).decode([avro_body(SCHEMA, r) for r in records], stamps)
    json_spec = KafkaSourceSpec.model_validate({**spec().model_dump(), "format": "json", "avro_schema": None})
    expected, json_bad = JsonRecordDecoder(json_spec).decode([as_json(r) for r in records], stamps)
    assert bad == [] and json_bad == [] and table is not None and expected is not None
    for i, field in enumerate(expected.schema):  # the JSON decoder leaves all-string id fields to the normaliser
        if pa.types.is_string(field.type) or field.type == pa.list_(pa.string()):
            expected = expected.set_column(i, field.name, hashed_ids(expected.column(i)))
    assert table.schema == expected.schema
    assert table.schema.field("user_id").type == pa.int64() and table.schema.field("d0").type == pa.float32()
    assert table.to_pydict() == expected.to_pydict()
    assert table.column("event_time").to_pylist()[:2] == [500, 1_001]  # i=0 has no ts: the record's
    assert table.column("click").null_count == sum(1 for r in records if r["click"] is None)


def test_timestamp_logical_type_boolean_label_and_enum_id() -> None:
    schema = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "click", "type": "boolean"},
            {"name": "d0", "type": "float"},
            {"name": "country", "type": {"type": "enum", "name": "Country", "symbols": ["DE", "FR"]}},
        ],
    }
    one = KafkaSourceSpec.model_validate(
        {
            "name": "events",
            "type": "kafka",
            "topic": "t",
            "format": "avro",
            "avro_schema": json.dumps(schema),  # the JSON text works as well as a mapping
            "columns": {"ts": "event_time", "label": "click", "dense": ["d0"], "sparse": ["country"], "ts_unit": "s"},
        }
    )
    when = datetime(2026, 11, 28, 10, 30, tzinfo=timezone.utc)
    value = avro_body(schema, {"event_time": when, "click": True, "d0": 1.5, "country": "FR"})
    table, bad = AvroRecordDecoder(one).decode([value], [0])
    assert bad == [] and table is not None
    french = stable_hash64(pa.array(["FR"]))[0].as_py()  # an enum symbol is hashed like a string
    assert table.to_pylist() == [{"event_time": int(when.timestamp()), "click": 1.0, "d0": 1.5, "country": french}]


def test_undecodable_plain_records_are_counted_with_a_reason() -> None:
    good = avro_body(SCHEMA, record(1))
    values = [good, good[:-3], b"", good + b"\x00\x00", avro_body(SCHEMA, record(2)), None]
    table, bad = AvroRecordDecoder(spec()).decode(values, [0] * len(values))
    assert table is not None and table.column("sample_id").to_pylist() == [1, 2]
    reasons = dict(bad)
    assert sorted(reasons) == [1, 2, 3, 5]
    assert "does not decode (EOFError" in reasons[1]
    assert reasons[2] == reasons[5] == "empty record"
    assert "2 bytes left after the Avro body" in reasons[3]


def test_weights_and_ids_of_different_lengths_are_a_bad_record() -> None:
    rec = dict(record(3), tags=["a", "b"], tags_w=[1.0])
    table, bad = AvroRecordDecoder(spec()).decode([avro_body(SCHEMA, record(2)), avro_body(SCHEMA, rec)], [0, 0])
    assert table is not None and table.num_rows == 1
    assert bad == [(1, "weights and ids lists differ in length")]


def test_a_list_holding_integers_and_strings_is_a_bad_record() -> None:
    schema = json.loads(json.dumps(SCHEMA))
    schema["fields"][7]["type"] = ["null", {"type": "array", "items": ["long", "string"]}]
    values = [avro_body(schema, dict(record(2), tags=[1])), avro_body(schema, dict(record(4), tags=[1, "a"]))]
    values.append(avro_body(schema, dict(record(6), tags=["a"])))
    table, bad = AvroRecordDecoder(spec(avro_schema=schema)).decode(values, [0, 0, 0])
    assert table is not None and table.column("sample_id").to_pylist() == [2, 6]
    assert [i for i, _ in bad] == [1] and "both integers and strings" in bad[0][1]


def test_a_writer_schema_that_does_not_fit_the_columns_is_refused_naming_the_field() -> None:
    schema = json.loads(json.dumps(SCHEMA))
    schema["fields"][1] = {"name": "click", "type": "string"}
    with pytest.raises(SchemaMismatchError, match=r"source 'events': avro_schema: field 'click' is Avro \"string\""):
        AvroRecordDecoder(spec(avro_schema=schema))


def test_reader_schema_evolution_fills_a_field_the_writer_lacks_with_its_default() -> None:
    old = {
        "type": "record",
        "name": "Event",
        "fields": [f for f in SCHEMA["fields"] if f["name"] not in ("item_id", "d1")],
    }
    reader = json.loads(json.dumps(SCHEMA))
    reader["fields"][6] = {"name": "item_id", "type": ["long", "string"], "default": 77}
    values = [avro_body(old, {k: v for k, v in record(i).items() if k not in ("item_id", "d1")}) for i in range(3)]
    table, bad = AvroRecordDecoder(spec(avro_schema=old, avro_reader_schema=reader)).decode(values, [0, 0, 0])
    assert bad == [] and table is not None
    assert table.column("item_id").to_pylist() == [77, 77, 77]
    assert table.column("d1").to_pylist() == [None, None, None]  # the reader's default (null)


# -- the registry ----------------------------------------------------------------------------------------


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    with TestRegistry() as server:
        yield server


def test_registry_records_decode_with_ids_cached_and_unknown_ids_counted(registry: TestRegistry) -> None:
    sid = registry.register("t-value", SCHEMA)
    values = [framed(sid, SCHEMA, record(i)) for i in range(30)]
    values[4] = framed(sid + 40, SCHEMA, record(4))  # an id nobody registered
    values[5] = b"\x01" + values[5][1:]  # another magic byte
    values[6] = values[6][:3]  # shorter than the header
    values[7] = values[7][:-2]  # a truncated body
    values[8] = framed(sid + 40, SCHEMA, record(8))
    decoder = AvroRecordDecoder(spec(avro_schema=None, schema_registry_url=registry.url))
    table, bad = decoder.decode(values, [0] * len(values))
    assert table is not None and table.num_rows == 25
    reasons = dict(bad)
    assert sorted(reasons) == [4, 5, 6, 7, 8]
    assert reasons[4] == reasons[8] == f"unknown schema id {sid + 40} (the registry answers 404)"
    assert "magic byte 0x01" in reasons[5] and "shorter than the Confluent wire header" in reasons[6]
    assert f"the Avro body of schema id {sid} does not decode (EOFError" in reasons[7]
    decoder.decode(values, [0] * len(values))  # a second chunk: nothing asked again
    assert registry.requests.count(f"GET /schemas/ids/{sid}") == 1
    assert registry.requests.count(f"GET /schemas/ids/{sid + 40}") == 1
    assert decoder.schema_ids == [sid, sid + 40]


def test_registry_writer_schemas_evolve_to_the_reader_schema(registry: TestRegistry) -> None:
    old = {"type": "record", "name": "Event", "fields": [f for f in SCHEMA["fields"] if f["name"] != "item_id"]}
    reader = json.loads(json.dumps(SCHEMA))
    reader["fields"][6] = {"name": "item_id", "type": ["long", "string"], "default": 77}
    v1, v2 = registry.register("t-value", old), registry.register("t-value", SCHEMA)
    assert v1 != v2
    old_record = {k: v for k, v in record(1).items() if k != "item_id"}
    values = [framed(v1, old, old_record), framed(v2, SCHEMA, record(3))]
    decoder = AvroRecordDecoder(spec(avro_schema=None, schema_registry_url=registry.url, avro_reader_schema=reader))
    table, bad = decoder.decode(values, [0, 0])
    assert bad == [] and table is not None and table.column("item_id").to_pylist() == [77, 3]


def test_a_registry_schema_that_does_not_fit_makes_its_records_bad(registry: TestRegistry) -> None:
    wrong = json.loads(json.dumps(SCHEMA))
    wrong["fields"][1] = {"name": "click", "type": "string"}
    good, bad_id = registry.register("t-value", SCHEMA), registry.register("t-value", wrong)
    values = [framed(good, SCHEMA, record(1)), framed(bad_id, wrong, dict(record(2), click="yes"))]
    table, bad = AvroRecordDecoder(spec(avro_schema=None, schema_registry_url=registry.url)).decode(values, [0, 0])
    assert table is not None and table.num_rows == 1
    assert bad == [
        (1, f"schema id {bad_id}: field 'click' is Avro \"string\"; its column is the label (a number or a boolean)")
    ]


def test_a_registry_with_basic_auth_gets_the_password_from_the_variable_named() -> None:
    with TestRegistry(user="trainer", password="regPW") as registry:
        sid = registry.register("t-value", SCHEMA)
        keys = {"avro_schema": None, "schema_registry_url": registry.url, "schema_registry_user": "trainer"}
        keyed = spec(**keys, schema_registry_password_env="REGISTRY_PW")
        table, bad = AvroRecordDecoder(keyed, environ={"REGISTRY_PW": "regPW"}).decode(
            [framed(sid, SCHEMA, record(1))], [0]
        )
        assert bad == [] and table is not None
        with pytest.raises(
            SchemaRegistryError, match=r"HTTP 401.*schema_registry_user 'trainer'.*\$REGISTRY_PW"
        ) as err:
            AvroRecordDecoder(keyed, environ={"REGISTRY_PW": "wrong"}).decode([framed(sid, SCHEMA, record(1))], [0])
        assert "wrong" not in str(err.value)
        with pytest.raises(SchemaRegistryError, match=r"'REGISTRY_PW' .* is not set"):
            AvroRecordDecoder(keyed, environ={}).decode([framed(sid, SCHEMA, record(1))], [0])


def test_a_registry_that_does_not_answer_is_a_clear_error_within_the_timeout() -> None:
    """Not a bad record: the read cannot go on. A refused connection, and a server that never answers."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{free.getsockname()[1]}"
    with pytest.raises(
        SchemaRegistryError, match=rf"source 'events': schema registry {refused}/schemas/ids/1: no answer"
    ):
        AvroRecordDecoder(spec(avro_schema=None, schema_registry_url=refused)).decode(
            [framed(1, SCHEMA, record(1))], [0]
        )
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        decoder = AvroRecordDecoder(spec(avro_schema=None, schema_registry_url=url), timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(SchemaRegistryError, match=r"no answer within 0.5 s"):
            decoder.decode([framed(1, SCHEMA, record(1))], [0])
        assert time.monotonic() - started < 5


# -- the spec --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keys,words",
    [
        ({"avro_schema": None}, "format avro needs exactly one of `avro_schema`"),
        ({"avro_schema": SCHEMA, "schema_registry_url": "http://r:8081"}, "format avro needs exactly one of"),
        ({"format": "json"}, "avro_schema: only used with format: avro"),
        (
            {"avro_schema": {"type": "record", "name": "E", "fields": [{"name": "a", "type": "lng"}]}},
            "source 'events': avro_schema: not a valid Avro schema",
        ),
        ({"avro_schema": "{not json"}, "source 'events': avro_schema: not a JSON Avro schema"),
        ({"avro_schema": {"type": "string"}}, "an Avro record schema is expected"),
        ({"avro_schema": None, "schema_registry_url": "ftp://r"}, "an http:// or https:// URL"),
        ({"avro_schema": None, "schema_registry_url": "http://u:pw@r:8081"}, "no credentials in the URL"),
        ({"schema_registry_user": "u", "schema_registry_password_env": "P"}, "only used with schema_registry_url"),
        ({"avro_schema": None, "schema_registry_url": "http://r", "schema_registry_user": "u"}, "go together"),
        ({"schema_registry_password": "pw"}, "a password is never written in the spec"),
    ],
)
def test_spec_errors_are_clear(keys: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")) as err:
        spec(**keys)
    assert "pw@" not in str(err.value) and "'pw'" not in str(err.value)


def test_json_is_the_default_format() -> None:
    plain = KafkaSourceSpec.model_validate({"name": "e", "type": "kafka", "topic": "t", "columns": COLUMNS})
    assert plain.format == "json" and plain.avro_schema is None and plain.schema_registry_url is None
    assert spec(avro_schema=None, schema_registry_url="http://r:8081/").schema_registry_url == "http://r:8081"


# -- over the embedded broker (integration) --------------------------------------------------------------

H0 = datetime(2026, 11, 28, 10, tzinfo=timezone.utc)
H0_MS = int(H0.timestamp() * 1000)
HOUR_MS = 3_600_000


def avro_topic(broker: EmbeddedBroker, registry: TestRegistry, n: int, unknown_at: int) -> dict[str, Any]:
    """``n`` records in hour 0 over 2 partitions (one with an unknown schema id, at index ``unknown_at``),
    and one in hour 1 per partition (so hour 0 is complete); the topic and the sample ids of hour 0."""
    topic = f"avro-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic, 2)
    sid = registry.register(f"{topic}-value", SCHEMA)
    out = []
    for i in range(n):
        ts = H0_MS + i * (HOUR_MS // n)
        out.append((framed(sid + 99 if i == unknown_at else sid, SCHEMA, record(i, ts)), ts, i % 2))
    out += [(framed(sid, SCHEMA, record(10_000 + p, H0_MS + HOUR_MS + 1)), H0_MS + HOUR_MS + 1, p) for p in (0, 1)]
    produce_avro(broker.bootstrap_servers, topic, out)
    return {"topic": topic, "ids": Counter(i for i in range(n) if i != unknown_at), "unknown": sid + 99}


@pytest.mark.integration
@pytest.mark.parametrize("fetcher", ["confluent-kafka", "kafka-python"])
def test_an_avro_topic_reads_through_the_adapter_counting_the_unknown_id(kafka_broker, fetcher: str) -> None:
    with TestRegistry() as registry:
        world = avro_topic(kafka_broker, registry, 120, unknown_at=17)
        source = spec(avro_schema=None, schema_registry_url=registry.url, topic=world["topic"], fetcher=fetcher)
        got: Counter = Counter()
        with KafkaSource(source, SourceContext("/tmp", kafka_broker.bootstrap_servers)) as src:
            part = src.partition(H0)
            assert part.ready
            bad = []
            for task in src.split(part):
                for batch in src.read(task):
                    got.update(batch.column("sample_id").to_pylist())
                bad += src.last_read_stats["bad_examples"]
            assert src.stats["bad_records"] == 1
            assert src.normalize.take()["undecodable_record"] == 1
        assert got == world["ids"]
        assert [b["error"] for b in bad] == [f"unknown schema id {world['unknown']} (the registry answers 404)"]
        assert isinstance(bad[0]["offset"], int)


@pytest.mark.integration
def test_a_registry_down_fails_the_read_naming_the_url(kafka_broker) -> None:
    with TestRegistry() as registry:
        world = avro_topic(kafka_broker, registry, 10, unknown_at=-1)
    source = spec(avro_schema=None, schema_registry_url=registry.url, topic=world["topic"])  # stopped now
    with KafkaSource(source, SourceContext("/tmp", kafka_broker.bootstrap_servers), connect_timeout_s=2) as src:
        task = src.split(src.partition(H0))[0]
        with pytest.raises(SourceReadError, match=rf"schema registry {registry.url}/schemas/ids/\d+: no answer"):
            list(src.read(task))


JOB = """
name: avro-train
data: {{lease: 5s}}
pools: {{data: {{replicas: 1, task_runners: 1}}, training: {{replicas: 1}}}}
dataset:
  start: 2026-11-28T10:00
  streams:
    - name: live
      window: 1h
      sources:
        - {{name: events, type: kafka, kind: stream, topic: {topic}, batch_rows: 50, format: avro,
           schema_registry_url: "{url}", columns: {columns}}}
training:
  mode: stream
  model: {{type: single, embedding_dim: 4, hash_buckets: 1024, memory_hidden: [8], adapt_hidden: [8]}}
  batch_size: 50
  checkpoint_every_steps: 100
tracking: {{tracking_uri: "sqlite:///{root}/mlflow.db", experiment: avro-train}}
"""


@pytest.mark.integration
def test_an_avro_topic_with_a_registry_trains_end_to_end(kafka_broker, tmp_path: Path) -> None:
    """Every record of the hour trained once through the data plane's executor processes; the record with
    an unknown schema id counted as undecodable, the run not failed."""
    from primus_dagster.spec import load_job_spec
    from primus_dagster.training.run_state import RunHooks, TrainingRequest
    from primus_dagster.training.window import train_window

    with TestRegistry() as registry:
        world = avro_topic(kafka_broker, registry, 300, unknown_at=42)
        job_path = tmp_path / "job.yaml"
        text = JOB.format(topic=world["topic"], url=registry.url, columns=json.dumps(COLUMNS), root=tmp_path)
        job_path.write_text(text)
        job = load_job_spec(job_path)
        seen: list[int] = []
        result = train_window(
            TrainingRequest(
                job,
                job_path,
                tmp_path,
                TimeWindow(H0, H0 + timedelta(hours=1)),
                kafka_bootstrap=kafka_broker.bootstrap_servers,
                executors=1,
                evaluate=False,
            ),
            RunHooks(on_batch=lambda step, batch, trainer: seen.extend(int(i) for i in batch.sample_id.tolist())),
        )
    assert Counter(seen) == world["ids"]  # each once; the unknown-id record never
    assert result.data_quality["events"]["undecodable_record"] == 1
    assert result.failed_tasks == []
