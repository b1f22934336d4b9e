"""Kafka source: a topic of JSON (or Avro) samples, partitioned hourly/daily by record timestamp, or read as a live tail.

Modules: :mod:`.adapter` (``KafkaSource``: partitions, split, read, tail, high watermarks, close;
connection and config errors), :mod:`.clients` (the two clients it reads through, confluent-kafka by
default and kafka-python: probes and bounded range reads), :mod:`.offsets` (time boundaries to offset
ranges: the broker's ``offsets_for_times``, checked, or a binary search over record timestamps on a
broker that ignores them), :mod:`.tail` (committed offsets to fixed ``[start, stop)`` tasks and lag),
:mod:`.security` (the source's security keys as client settings, the TLS pre-flight) and
:mod:`.decoding` (record values to Arrow tables, isolating undecodable records; its polars fast path
:mod:`.polars_json`), :mod:`.avro` (Avro
values, ``format: avro``: an inline schema or a Confluent schema registry).

Example::

    from primus_dagster.data.sources.kafka import KafkaSource
    with KafkaSource(spec, SourceContext(kafka_bootstrap_servers="127.0.0.1:9092")) as src:
        batches = [b for t in src.split(src.partition(hour)) for b in src.read(t)]
        plan = src.tail(committed)            # TailPlan: tasks up to the high watermarks, lag, next_offsets
"""

from primus_dagster.data.sources.kafka.adapter import FETCHERS, MAX_BAD_EXAMPLES, KafkaConfigError, KafkaSource
from primus_dagster.data.sources.kafka.avro import AvroRecordDecoder, SchemaRegistryError
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder, json_schema
from primus_dagster.data.sources.kafka.offsets import OffsetSearch
from primus_dagster.data.sources.kafka.tail import TailOffsetError, TailPlan, plan_tail

__all__ = [
    "FETCHERS",
    "MAX_BAD_EXAMPLES",
    "AvroRecordDecoder",
    "JsonRecordDecoder",
    "KafkaConfigError",
    "KafkaSource",
    "OffsetSearch",
    "SchemaRegistryError",
    "TailOffsetError",
    "TailPlan",
    "json_schema",
    "plan_tail",
]
