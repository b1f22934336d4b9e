"""A Kafka source asset against the embedded broker, its Kafka resource nested in the storage resource:
offsets and undecodable records in metadata, the blocking checks passed."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from dagster import materialize
from kafka import KafkaProducer

from primus_dagster.dagster_defs import KafkaResource, PrimusStorageResource, build_source_assets
from primus_dagster.devtools.kafka_broker import create_topic
from primus_dagster.spec import parse_job_spec

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def test_kafka_asset_counts_bad_records_and_records_offsets(kafka_broker, tmp_path) -> None:
    topic = "asset-bad-records"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
    ms = int(T0.timestamp() * 1000)
    for i in range(20):
        value = json.dumps({"id": i, "t": ms + i * 1000, "y": i % 2, "d": 0.5}).encode()
        producer.send(topic, value, partition=0, timestamp_ms=ms + i * 1000)
    for i, bad in enumerate([b"{not json", b'{"id": 99, "t": "soon", "y": 1, "d": 0.1}', b"[1, 2]"]):
        producer.send(topic, bad, partition=0, timestamp_ms=ms + 30_000 + i)
    # One record in the next hour: the stream has moved past hour 0, so it is ready.
    producer.send(
        topic,
        json.dumps({"id": 100, "t": ms + 3_600_000, "y": 0, "d": 0.0}).encode(),
        partition=0,
        timestamp_ms=ms + 3_600_000,
    )
    producer.flush()
    producer.close()

    job = parse_job_spec(f"""
name: k
dataset:
  start: 2026-11-01
  streams:
    - name: live
      window: 1h
      sources:
        - {{name: events, type: kafka, kind: stream, topic: {topic}, columns: {{ts: t, label: y, id: id, dense: [d]}}}}
""")
    result = materialize(
        build_source_assets(job),
        partition_key="2026-11-01-00:00",
        resources={
            "storage": PrimusStorageResource(
                data_root=str(tmp_path), kafka=KafkaResource(bootstrap_servers=kafka_broker.bootstrap_servers)
            )
        },
    )
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["rows"].value == 20
    assert metadata["bad_records"].value == 3
    assert len(metadata["bad_record_examples"].value) == 3
    assert metadata["kafka_offsets"].value == {"0": [0, 23]}
    assert all(evaluation.passed for evaluation in result.get_asset_check_evaluations())
