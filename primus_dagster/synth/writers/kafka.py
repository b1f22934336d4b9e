"""Synthetic hours produced to a Kafka topic as JSON records, keyed and timestamped like the real stream.

Each row is one compact JSON object (timestamps as epoch milliseconds, built with Arrow
kernels), keyed by ``user_id`` into partition ``user_id % partitions`` with the event time as
record timestamp. Kafka is append-only, so re-writing an hour produces the records again
(consumers that need exactly-once deduplicate by ``sample_id``).

Example::

    writer = KafkaWriter(spec, SourceContext(kafka_bootstrap_servers="127.0.0.1:9092"), partitions=4)
    try:
        nbytes, _ = writer.write_hour(datetime(2026, 11, 1, 5, tzinfo=timezone.utc), hour_table)
    finally:
        writer.close()
    json_values(hour_table)[0]                 # '{"sample_id":…,"event_time":1793509200000,…}'
"""

from __future__ import annotations

import time
from contextlib import suppress
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec.sources import KafkaSourceSpec
from primus_dagster.synth.writers.base import SourceWriter


def epoch_ms(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Timestamps as int64 epoch milliseconds (truncated)."""
    return pc.cast(column, pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())


def json_values(table: pa.Table) -> pa.Array:
    """One compact JSON object per row (timestamps as epoch milliseconds), built with Arrow kernels."""
    if not table.num_rows:
        return pa.array([], pa.string())
    pieces: list[Any] = []
    for i, name in enumerate(table.column_names):
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = epoch_ms(column)
        text = pc.cast(column, pa.string())
        if column.null_count:
            text = pc.fill_null(text, "null")
        pieces += [f'{"{" if i == 0 else ","}"{name}":', text]
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "").combine_chunks()


class KafkaWriter(SourceWriter):
    """JSON records keyed by user_id into partition ``user_id % partitions``, timestamp = event time."""

    def __init__(
        self,
        spec: KafkaSourceSpec,
        context: SourceContext,
        partitions: int = 4,
        key_column: str = "user_id",
        ts_column: str = "event_time",
    ):
        from kafka import KafkaAdminClient, KafkaProducer
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        bootstrap = spec.bootstrap_servers or context.kafka_bootstrap_servers
        if not bootstrap:
            raise ValueError(
                f"source {spec.name!r}: no Kafka bootstrap servers (set bootstrap_servers in the spec, "
                f"--kafka-bootstrap or PRIMUS_KAFKA_BOOTSTRAP_SERVERS)"
            )
        self.spec, self.key_column, self.ts_column = spec, key_column, ts_column
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="primus-synth")
        try:
            if spec.topic not in admin.list_topics():
                with suppress(TopicAlreadyExistsError):
                    admin.create_topics([NewTopic(spec.topic, num_partitions=partitions, replication_factor=1)])
        finally:
            admin.close()
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id="primus-synth",
            acks=1,
            linger_ms=20,
            batch_size=512 * 1024,
            max_in_flight_requests_per_connection=1,  # keeps per-partition order on retries
        )
        deadline = time.monotonic() + 30
        while not (found := self.producer.partitions_for(spec.topic)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not found:
            raise RuntimeError(f"Kafka topic {spec.topic!r} has no partitions on {bootstrap}")
        self.partitions = len(found)
        self._errors: list[BaseException] = []

    def _on_error(self, exc: BaseException) -> None:
        self._errors.append(exc)

    def write_hour(self, start: datetime, table: pa.Table) -> tuple[int, int]:
        if not table.num_rows:
            return 0, 0
        values = json_values(table)
        keys = table.column(self.key_column).to_numpy()
        parts = (keys % self.partitions).tolist()
        key_bytes = pc.cast(table.column(self.key_column), pa.string()).cast(pa.binary()).to_pylist()
        ts_ms = epoch_ms(table.column(self.ts_column)).to_numpy().tolist()
        send, topic, on_error = self.producer.send, self.spec.topic, self._on_error
        for value, key, part, ts in zip(values.cast(pa.binary()).to_pylist(), key_bytes, parts, ts_ms, strict=False):
            send(topic, value=value, key=key, partition=part, timestamp_ms=ts).add_errback(on_error)
        self.producer.flush()
        if self._errors:
            raise RuntimeError(f"Kafka topic {topic!r}: {len(self._errors)} record(s) failed: {self._errors[0]!r}")
        return int(pc.sum(pc.binary_length(values)).as_py()), 0

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()
