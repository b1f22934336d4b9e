"""Synthetic hours produced to a Kafka topic as JSON records, keyed and timestamped like the real stream.

Each row is one compact JSON object (timestamps as epoch milliseconds, strings quoted and
escaped, lists as arrays; built with Arrow kernels), keyed by ``user_id`` into partition
``user_id % partitions`` (a string key: its :func:`~primus_dagster.data.hashing.stable_hash64`
mod ``partitions``) with the event time (the spec's ``columns.ts``; integer epochs in its
``ts_unit``) as record timestamp. Kafka is append-only, so re-writing an hour produces the
records again (consumers that need exactly-once deduplicate by ``sample_id``).

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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.sources.base import SourceContext
from primus_dagster.spec.sources import KafkaSourceSpec
from primus_dagster.synth.writers.base import SourceWriter


def epoch_ms(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Timestamps as int64 epoch milliseconds (truncated)."""
    return pc.cast(column, pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())


_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _quoted(strings: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """JSON string literals of ``strings`` (quoted, escaped; nulls stay null)."""
    text = pc.cast(strings, pa.string())
    for old, new in _ESCAPES:
        text = pc.replace_substring(text, old, new)
    if pc.any(pc.match_substring_regex(text, r"[\x00-\x1f]")).as_py():  # other control characters: rare
        for code in range(32):
            text = pc.replace_substring(text, chr(code), f"\\u{code:04x}")
    return pc.binary_join_element_wise('"', text, '"', "")


def _json_array(lists: pa.Array | pa.ChunkedArray) -> pa.Array:
    """JSON arrays of a list column's values (a null list: null)."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    items = _json_text(lists.values)
    joined = pc.binary_join(type(lists).from_arrays(lists.offsets, items, mask=lists.is_null()), ",")
    return pc.binary_join_element_wise("[", joined, "]", "")


def _json_text(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Each value as JSON text (timestamps as epoch ms, strings quoted, lists as arrays, nulls as null)."""
    if pa.types.is_timestamp(column.type):
        column = epoch_ms(column)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = _quoted(column)
    elif _is_list(column.type):
        text = _json_array(column)
    else:
        text = pc.cast(column, pa.string())
    if column.null_count:
        text = pc.fill_null(text, "null")
    return text


def json_values(table: pa.Table) -> pa.Array:
    """One compact JSON object per row (timestamps as epoch milliseconds, strings quoted and escaped, lists
    as arrays), built with Arrow kernels."""
    if not table.num_rows:
        return pa.array([], pa.string())
    pieces: list[Any] = []
    for i, name in enumerate(table.column_names):
        pieces += [f'{"{" if i == 0 else ","}"{name}":', _json_text(table.column(name))]
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "").combine_chunks()


class KafkaWriter(SourceWriter):
    """JSON records keyed by user_id into partition ``user_id % partitions`` (a string key: its stable hash
    mod ``partitions``), record timestamp = the event time (``ts_column``, default the spec's ``columns.ts``)."""

    def __init__(
        self,
        spec: KafkaSourceSpec,
        context: SourceContext,
        partitions: int = 4,
        key_column: str = "user_id",
        ts_column: str | None = None,
    ):
        from kafka import KafkaAdminClient, KafkaProducer
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        from primus_dagster.data.sources.kafka.security import client_security_config

        bootstrap = spec.bootstrap_servers or context.kafka_bootstrap_servers
        if not bootstrap:
            raise ValueError(
                f"source {spec.name!r}: no Kafka bootstrap servers (set bootstrap_servers in the spec, "
                f"--kafka-bootstrap or PRIMUS_KAFKA_BOOTSTRAP_SERVERS)"
            )
        self.spec, self.key_column, self.ts_column = spec, key_column, ts_column or spec.columns.ts
        security = client_security_config(spec, spec.name)  # the source's TLS / SASL keys, as its readers use them
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="primus-synth", **security)
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
            **security,
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
        key_column = table.column(self.key_column)
        if pa.types.is_integer(key_column.type):
            parts = (key_column.to_numpy() % self.partitions).tolist()
        else:  # a string id: the same stable hash the data plane gives it
            from primus_dagster.data.hashing import stable_hash64

            hashed = stable_hash64(key_column).to_numpy().view(np.uint64)
            parts = (hashed % np.uint64(self.partitions)).astype(np.int64).tolist()
        key_bytes = pc.cast(key_column, pa.string()).cast(pa.binary()).to_pylist()
        ts = table.column(self.ts_column)
        if pa.types.is_integer(ts.type):  # integer epochs in the spec's ts_unit
            ts = ts.cast(pa.int64()).cast(pa.timestamp(self.spec.columns.ts_unit, tz="UTC"))
        ts_ms = epoch_ms(ts).to_numpy().tolist()
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
