"""The synthetic world in a real team's shape (``primus-dagster synth --schema realistic``)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec import load_job_spec, parse_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.synth.cli import main as synth_main
from primus_dagster.synth.realistic import (
    AGE_GROUPS,
    COUNTRIES,
    DEVICES,
    GENDERS,
    GENRES,
    RealisticWorld,
    realistic_schema,
)
from primus_dagster.synth.writers.kafka import json_values

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
SPEC = Path(__file__).resolve().parents[2] / "examples" / "realistic" / "job.yaml"
SMALL = ["--seed", "3", "--users", "400", "--items", "120", "--topics", "6", "--rows-per-hour", "60"]


def small_config(seed: int = 3, rows_per_hour: float = 800) -> WorldConfig:
    return WorldConfig(seed=seed, users=2_000, items=300, topics=8, rows_per_hour=rows_per_hour)


@pytest.fixture(scope="module")
def world() -> RealisticWorld:
    return RealisticWorld(small_config(), START)


@pytest.fixture(scope="module")
def two_days(world: RealisticWorld) -> pa.Table:
    return pa.concat_tables([world.hour(h) for h in range(48)])


def test_schema_and_types(world: RealisticWorld) -> None:
    table = world.hour(5)
    assert table.schema.equals(realistic_schema())
    assert table.num_rows > 0 and isinstance(world, SyntheticWorld)
    assert all(re.fullmatch(r"u\d{6}", u) for u in pc.unique(table["user_id"]).to_pylist())
    assert all(re.fullmatch(r"i\d{6}", i) for i in pc.unique(table["item_id"]).to_pylist())
    for column, vocabulary in (("gender", GENDERS), ("age_group", AGE_GROUPS), ("country", COUNTRIES)):
        assert set(pc.unique(table[column]).to_pylist()) <= set(vocabulary), column
    assert set(pc.unique(table["device"]).to_pylist()) <= set(DEVICES)
    lengths = pc.list_value_length(table["genres"]).to_numpy()
    assert lengths.min() >= 1 and lengths.max() <= 4
    flat = pc.list_flatten(table["genres"])
    assert set(pc.unique(flat).to_pylist()) <= set(GENRES)
    rows = table["genres"].to_pylist()[:200]
    assert all(len(set(g)) == len(g) for g in rows)  # distinct within an item
    # epoch seconds inside the hour, the native rows one for one
    native = world.native_hour(5)
    hour_s = int((START + timedelta(hours=5)).timestamp())
    ts = table["event_ts"].to_numpy()
    assert ts.min() >= hour_s and ts.max() < hour_s + 3600 and np.all(np.diff(ts) >= 0)
    assert np.array_equal(ts, native["event_time"].cast(pa.int64()).to_numpy() // 1_000_000)
    assert table["sample_id"].equals(native["sample_id"])
    assert np.array_equal(table["liked"].to_numpy(), native["click"].to_numpy())
    # raw, skewed scales
    price = table["price"].to_numpy()
    assert price.min() >= 1 and price.max() <= 5000 and np.median(price) < price.mean()
    age = table["item_age_days"].to_numpy()
    assert age.min() >= 0 and age.max() <= 3000
    clicks = table["user_clicks_30d"].to_numpy()
    assert clicks.min() >= 0 and clicks.max() > 20 * max(np.median(clicks), 1)  # heavy tail
    assert table["session_len_s"].to_numpy().min() >= 1
    rate = table["topic_ctr_1h"].to_numpy()
    assert rate.min() > 0 and rate.max() < 1


def test_users_and_items_keep_their_attributes(two_days: pa.Table) -> None:
    for key, columns in (("user_id", ["gender", "age_group", "country"]), ("item_id", ["genres"])):
        pairs = two_days.select([key, *columns]).to_pylist()
        seen: dict[str, dict] = {}
        for row in pairs[:5000]:
            attrs = {c: row[c] for c in columns}
            assert seen.setdefault(row[key], attrs) == attrs, key


def test_deterministic_by_seed_and_hour(world: RealisticWorld) -> None:
    again = RealisticWorld(small_config(), START)
    assert again.hour(7).equals(world.hour(7))
    later = RealisticWorld(small_config(), START + timedelta(hours=6))  # hours keyed by absolute time
    assert later.hour(1).equals(world.hour(7))
    other = RealisticWorld(small_config(seed=4), START).hour(7)
    assert not other.equals(world.hour(7))


def test_needs_the_informative_dense_features() -> None:
    with pytest.raises(ValueError, match="n_dense >= 5"):
        RealisticWorld(WorldConfig(n_dense=4), START)


def _auc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))


def test_labels_carry_signal(world: RealisticWorld, two_days: pa.Table) -> None:
    day = 24 * 800  # about: the first day's rows come first
    y = two_days["liked"].to_numpy()
    n1 = int(np.searchsorted(two_days["event_ts"].to_numpy(), int((START + timedelta(days=1)).timestamp())))
    assert n1 > day // 2
    # the item's like-rate on day 1 predicts day 2 (a popularity prior): items differ
    items = two_days["item_id"].combine_chunks().dictionary_encode().indices.to_numpy()
    clicks = np.bincount(items[:n1], weights=y[:n1], minlength=items.max() + 1)
    shown = np.bincount(items[:n1], minlength=items.max() + 1)
    prior = (clicks + 1) / (shown + 20)
    assert _auc(y[n1:], prior[items[n1:]]) > 0.52
    often = shown >= 100  # like-rates of the items shown often: spread wider than binomial noise would
    rate = clicks[often] / shown[often]
    noise = np.mean(rate * (1 - rate) / shown[often])
    assert np.var(rate) > 1.5 * noise
    # the raw numbers carry their dense feature's signal; genres carry the topic's
    assert _auc(y, np.log1p(two_days["user_clicks_30d"].to_numpy())) > 0.53
    assert _auc(y, two_days["topic_ctr_1h"].to_numpy()) > 0.55
    primary = pc.list_element(two_days["genres"], 0).combine_chunks().dictionary_encode().indices.to_numpy()
    rates = np.bincount(primary, weights=y) / np.maximum(np.bincount(primary), 1)
    assert rates.max() > 1.5 * rates[rates > 0].min()
    # and the generator's own logit (the oracle) still ranks them
    table = world.hour(30)
    assert _auc(table["liked"].to_numpy(), world.click_logit(table, 30)) > 0.75


def test_stream_copy_misses_late_clicks(two_days: pa.Table, world: RealisticWorld) -> None:
    stream = world.stream_copy(two_days)
    late = two_days["click_delay_s"].to_numpy(zero_copy_only=False) > world.config.stream_label_window.total_seconds()
    batch, early = two_days["liked"].to_numpy(), stream["liked"].to_numpy()
    assert np.all(early <= batch) and early.sum() < batch.sum()
    assert np.array_equal(early, batch & ~np.nan_to_num(late).astype(bool))


def test_json_values_quote_strings_and_write_lists() -> None:
    table = pa.table(
        {
            "s": pa.array(['a"b\\c', None, "x\ny\x01"]),
            "l": pa.array([["p", 'q"'], None, []], pa.list_(pa.string())),
            "n": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
        }
    )
    decoded = [json.loads(v) for v in json_values(table).to_pylist()]
    assert decoded == table.to_pylist()
    assert json_values(table.slice(1, 2)).to_pylist() == json_values(table).to_pylist()[1:]


def test_synth_writes_sources_the_spec_reads(tmp_path: Path) -> None:
    from primus_dagster.data.sources import make_adapter
    from primus_dagster.data.sources.base import TimeWindow

    args = ["--data-root", str(tmp_path), "--sources", "events_parquet", "events_delta", "--no-progress", "--json"]
    assert synth_main(["--schema", "realistic", "--days", "1", *args, *SMALL]) == 0
    day = tmp_path / "realistic/parquet/events/dt=2026-11-01"
    assert (day / "_SUCCESS").exists() and len(list(day.glob("part-*.parquet"))) == 24
    schema = pq.read_schema(next(day.glob("part-*.parquet")))
    assert schema.field("user_id").type == pa.string() and schema.field("event_ts").type == pa.int64()
    assert pa.types.is_list(schema.field("genres").type) and "click_delay_s" not in schema.names
    job = load_job_spec(SPEC)
    world = RealisticWorld(WorldConfig(seed=3, users=400, items=120, topics=6, rows_per_hour=60), START)
    expected = sum(world.hour(h).num_rows for h in range(24))
    total = 0
    for name in ("events_parquet", "events_delta"):
        with make_adapter(job.dataset.source(name), SourceContext(str(tmp_path))) as adapter:
            parts = [p for p in adapter.partitions(TimeWindow.hours_from(START, 24)) if p.ready]
            assert parts, name
            batches = [b for p in parts for t in adapter.split(p) for b in adapter.read(t)]
        rows = sum(b.num_rows for b in batches)
        total += rows
        first = batches[0]
        assert pa.types.is_list(first.schema.field("genres").type), name  # read as a list of hashed ids
        assert first.schema.field("user_id").type == pa.int64(), name
        ts = pa.concat_arrays([b.column("ts") for b in batches]).cast(pa.int64()).to_numpy()
        assert ts.min() >= int(START.timestamp()) * 10**6 and ts.max() < int(START.timestamp() + 86_400) * 10**6
    assert total == expected  # the two batch shards are the whole world


def test_synth_rejects_a_spec_of_the_other_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--data-root", str(tmp_path), "--hours", "1", "--no-progress", *SMALL]
    assert synth_main(["--schema", "realistic", "--spec", "examples/job.yaml", *base]) == 2
    assert "does not write" in capsys.readouterr().err
    iceberg = tmp_path / "iceberg.yaml"
    iceberg.write_text(
        SPEC.read_text().replace(
            "type: delta\n          kind: batch\n          granularity: hour\n          label_delay: 24h\n"
            "          uri: realistic/delta/events\n          date_column: dt\n          hour_column: hour\n",
            "type: iceberg\n          kind: batch\n          granularity: hour\n          label_delay: 24h\n"
            "          table: synth.realistic\n",
        )
    )
    assert synth_main(["--schema", "realistic", "--spec", str(iceberg), *base]) == 2
    assert "no Iceberg" in capsys.readouterr().err


@pytest.mark.integration
def test_kafka_stream_copy_of_the_realistic_shape(tmp_path: Path, kafka_broker: object) -> None:
    from kafka import KafkaConsumer, TopicPartition

    from primus_dagster.data.hashing import stable_hash64

    topic = f"realistic-{uuid.uuid4().hex[:8]}"
    job = parse_job_spec(SPEC.read_text().replace("topic: realistic-events", f"topic: {topic}"))
    world = RealisticWorld(WorldConfig(seed=5, users=300, items=100, topics=6, rows_per_hour=300), START)
    bootstrap = kafka_broker.bootstrap_servers  # type: ignore[attr-defined]
    summary = write_world(
        job, SourceContext(str(tmp_path), bootstrap), world, range(1), sources=["events_kafka"], progress=False
    )
    expected = world.stream_copy(world.hour(0)).drop_columns(["click_delay_s"])
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    records = []
    for message in consumer:
        value = json.loads(message.value)
        assert message.timestamp == value["event_ts"] * 1000 and message.key.decode() == value["user_id"]
        hashed = int(stable_hash64(pa.array([value["user_id"]])).to_numpy().view(np.uint64)[0])
        assert message.partition == hashed % len(partitions)
        records.append(value)
        if len(records) == expected.num_rows:
            break
    consumer.close()
    assert len(records) == expected.num_rows == summary.sources["events_kafka"].rows
    got = pa.Table.from_pylist(sorted(records, key=lambda r: r["sample_id"]), schema=expected.schema)
    want = expected.sort_by("sample_id")
    assert got.drop_columns(["topic_ctr_1h"]).equals(want.drop_columns(["topic_ctr_1h"]))
    np.testing.assert_allclose(got["topic_ctr_1h"].to_numpy(), want["topic_ctr_1h"].to_numpy(), rtol=1e-6)
    assert 0 < pc.sum(got["liked"]).as_py() < pc.sum(world.hour(0)["liked"]).as_py()  # the late clicks are missing
