"""The stream sensor against the embedded Kafka-compatible broker and a real Dagster instance: offsets
below the thresholds give an observation and no run, past ``min_new_records`` (or after ``max_wait``) a
live increment and one run of the closed hour, no live increment while one runs, lag counts what the
newest model (a training partition or the live model) has not read, and a broker that cannot be reached is
named in the skip reason."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    build_sensor_context,
    instance_for_test,
)
from kafka import KafkaProducer

from primus_dagster.dagster_defs import KafkaResource, PrimusStorageResource, build_stream_sensor
from primus_dagster.dagster_defs.sensors import StreamCursor, kafka_watermarks, stream_progress
from primus_dagster.data import SourceContext, SourceReadError
from primus_dagster.devtools.kafka_broker import create_topic
from primus_dagster.ports import free_port
from primus_dagster.spec import JobSpec, parse_job_spec

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def job_for(topic: str, min_new_records: int = 50, max_wait: str = "10m") -> JobSpec:
    return parse_job_spec(f"""
name: stream
dataset:
  start: 2026-11-01
  streams:
    - name: history
      sources:
        - {{name: imp, type: parquet, kind: batch, path: imp, columns: &cols {{ts: t, label: y, id: id, dense: [d]}}}}
    - name: live
      window: 1h
      sources:
        - {{name: events, type: kafka, kind: stream, topic: {topic}, columns: *cols}}
training: {{mode: mixed, partition: hour, batch_lag: 1h}}
automation: {{min_new_records: {min_new_records}, max_wait: {max_wait}}}
""")


def produce(servers: str, topic: str, at: datetime, n: int, first_id: int = 0) -> None:
    """``n`` records with event time ``at`` (plus i seconds), alternating over partitions 0 and 1."""
    producer = KafkaProducer(bootstrap_servers=servers)
    ms = int(at.timestamp() * 1000)
    for i in range(n):
        value = json.dumps({"id": first_id + i, "t": ms + i * 1000, "y": i % 2, "d": 0.5}).encode()
        producer.send(topic, value, partition=i % 2, timestamp_ms=ms + i * 1000)
    producer.flush()
    producer.close()


class Ticker:
    """Evaluates one sensor against the instance with the cursor it left and a clock the test sets."""

    def __init__(self, job: JobSpec, instance: DagsterInstance, servers: str, tmp_path: Path):
        self.now = T0
        self.instance, self.cursor = instance, None
        self.sensor = build_stream_sensor(
            job, job.dataset.streams[1], job.dataset.source("events"), clock=lambda: self.now
        )
        kafka = KafkaResource(bootstrap_servers=servers)
        self.resources = {"storage": PrimusStorageResource(data_root=str(tmp_path), kafka=kafka)}

    def tick(self):
        with build_sensor_context(instance=self.instance, cursor=self.cursor, resources=self.resources) as context:
            result = self.sensor(context)
        self.cursor = result.cursor
        return result


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def observed(result) -> dict:
    (observation,) = result.asset_events
    assert observation.asset_key == AssetKey("events")
    return {k: v.value for k, v in observation.metadata.items()}


def test_offsets_past_the_threshold_ask_for_the_closed_hour_once(kafka_broker, instance, tmp_path) -> None:
    servers, topic = kafka_broker.bootstrap_servers, "sensor-threshold"
    create_topic(servers, topic, partitions=2)
    ticker = Ticker(job_for(topic, min_new_records=50), instance, servers, tmp_path)
    ticker.now = T0 + timedelta(hours=1, minutes=10)
    produce(servers, topic, T0, 30)
    below = ticker.tick()
    assert not below.run_requests and "below the thresholds" in below.skip_reason.skip_message
    assert observed(below)["lag"] == {"0": 15, "1": 15} and observed(below)["due"] is False
    produce(servers, topic, T0 + timedelta(hours=1), 30, first_id=30)  # 60 new records; hour 0 is closed
    past = ticker.tick()
    live, request = past.run_requests  # a live increment, and the closed hour for the training partition
    assert live.job_name == "stream_live_job" and live.asset_selection == [AssetKey("stream_live_model")]
    assert live.run_key.startswith("live:") and live.tags["primus/live"] == "events"
    assert request.partition_key == "2026-11-01-00:00" and request.asset_selection == [AssetKey("events")]
    assert request.job_name == "stream_events_hour_job" and "60 new records" in request.tags["primus/trigger"]
    meta = observed(past)
    assert meta["high_watermarks"] == {"0": 30, "1": 30} and meta["total_lag"] == 60 and meta["due"] is True
    quiet = ticker.tick()  # nothing moved: no observation, nothing asked
    assert not quiet.run_requests and not quiet.asset_events

    # A trained model that read partition 0 up to offset 20 leaves 10 + 30 records of lag.
    instance.report_runless_asset_event(
        AssetMaterialization(
            asset_key="stream_model",
            partition="2026-11-01-01:00",
            metadata={"source_versions": {"events": {"offsets": {f"{topic}:0": [0, 20]}}}},
        )
    )
    produce(servers, topic, T0 + timedelta(hours=1, minutes=5), 2, first_id=60)
    ticker.now = T0 + timedelta(hours=2, minutes=5)  # training 01:00 has closed
    assert observed(ticker.tick())["lag"] == {"0": 11, "1": 31}
    # A live model that read further counts: the lag is what the newest model has not read.
    instance.report_runless_asset_event(
        AssetMaterialization(
            asset_key="stream_live_model",
            metadata={"source_versions": {"events": {"offsets": {f"{topic}:0": [20, 31], f"{topic}:1": [0, 25]}}}},
        )
    )
    produce(servers, topic, T0 + timedelta(hours=1, minutes=6), 2, first_id=62)
    assert observed(ticker.tick())["lag"] == {"0": 1, "1": 7}


def test_no_live_increment_is_asked_for_while_one_runs(kafka_broker, instance, tmp_path) -> None:
    servers, topic = kafka_broker.bootstrap_servers, "sensor-live-busy"
    create_topic(servers, topic, partitions=2)
    ticker = Ticker(job_for(topic, min_new_records=10), instance, servers, tmp_path)
    ticker.now = T0 + timedelta(minutes=30)
    instance.add_run(DagsterRun(job_name="stream_live_job", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED))
    produce(servers, topic, T0, 20)
    busy = ticker.tick()
    assert not busy.run_requests and "a live increment is running" in busy.skip_reason.skip_message
    for run in instance.get_runs():
        instance.report_run_canceled(run)
    (live,) = ticker.tick().run_requests  # still due: asked for once the running one is done
    assert live.job_name == "stream_live_job"


def test_max_wait_asks_for_few_records_once_they_waited(kafka_broker, instance, tmp_path) -> None:
    servers, topic = kafka_broker.bootstrap_servers, "sensor-max-wait"
    create_topic(servers, topic, partitions=2)
    ticker = Ticker(job_for(topic, min_new_records=1000, max_wait="10m"), instance, servers, tmp_path)
    produce(servers, topic, T0, 4)
    produce(servers, topic, T0 + timedelta(hours=1), 2, first_id=4)
    ticker.now = T0 + timedelta(hours=1, minutes=1)
    (hour,) = ticker.tick().run_requests  # 6 records, waiting since now; the closed hour needs no threshold
    assert hour.partition_key == "2026-11-01-00:00" and "the hour is complete" in hour.tags["primus/trigger"]
    ticker.now += timedelta(minutes=9)
    assert not ticker.tick().run_requests
    ticker.now += timedelta(minutes=1)
    (live,) = ticker.tick().run_requests
    assert live.job_name == "stream_live_job" and "waited max_wait" in live.tags["primus/trigger"]
    assert StreamCursor.parse(ticker.cursor, "s").pending_since is None  # consumed


def test_an_unreachable_broker_is_named_and_the_cursor_kept(instance, tmp_path, capsys) -> None:
    servers = f"127.0.0.1:{free_port()}"  # nothing listens there
    ticker = Ticker(job_for("nowhere"), instance, servers, tmp_path)
    ticker.cursor = StreamCursor(requested={"0": 5}).dumps()
    why = f"cannot read the offsets of topic 'nowhere': source 'events': no Kafka broker answers at {servers}"
    results = [ticker.tick() for _ in range(3)]
    assert all(why in result.skip_reason.skip_message for result in results)  # every tick says why it skips
    assert StreamCursor.parse(results[-1].cursor, "s").requested == {"0": 5}
    # the sensor's log (Dagster's instigation logger prints it, as `dagster dev` does): once, not every tick
    assert capsys.readouterr().err.count(f"WARNING - events: {why}") == 1


def test_the_high_watermark_comes_from_a_fetch(kafka_broker) -> None:
    servers, topic = kafka_broker.bootstrap_servers, "sensor-watermarks"
    create_topic(servers, topic, partitions=3)
    produce(servers, topic, T0, 40)  # one batch per partition: the broker's end_offsets says 1
    context = SourceContext(kafka_bootstrap_servers=servers)
    assert kafka_watermarks(job_for(topic).dataset.source("events"), context) == {
        "0": (0, 20),
        "1": (0, 20),
        "2": (0, 0),
    }
    with pytest.raises(SourceReadError, match="topic 'absent' does not exist"):
        kafka_watermarks(job_for("absent").dataset.source("events"), context)


def test_stream_progress_thresholds_are_pure() -> None:
    marks = {"0": (0, 40), "1": (10, 30)}
    now = T0
    fresh = stream_progress(StreamCursor(), marks, {}, now, min_new_records=100, max_wait=timedelta(minutes=5))
    assert (fresh.new_records, fresh.due, fresh.lag) == (60, False, {"0": 40, "1": 20})
    waited = stream_progress(
        StreamCursor(pending_since=now - timedelta(minutes=5)), marks, {}, now, 100, timedelta(minutes=5)
    )
    assert waited.due and "waited max_wait" in waited.why
    after_request = stream_progress(StreamCursor(requested={"0": 40, "1": 30}), marks, {"0": 35}, now, 1, timedelta(1))
    assert (after_request.new_records, after_request.due, after_request.lag) == (0, False, {"0": 5, "1": 20})
