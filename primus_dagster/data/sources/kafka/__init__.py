"""Kafka source: a topic of JSON samples, partitioned hourly/daily by record timestamp.

Modules: :mod:`.adapter` (``KafkaSource``: partitions, split, read, close; connection and
config errors), :mod:`.offsets` (time boundaries to offset ranges by binary search over record
timestamps) and :mod:`.decoding` (record values to Arrow tables, isolating undecodable records).

Example::

    from primus_dagster.data.sources.kafka import KafkaSource
    with KafkaSource(spec, SourceContext(kafka_bootstrap_servers="127.0.0.1:9092")) as src:
        batches = [b for t in src.split(src.partition(hour)) for b in src.read(t)]
"""

from primus_dagster.data.sources.kafka.adapter import MAX_BAD_EXAMPLES, KafkaConfigError, KafkaSource
from primus_dagster.data.sources.kafka.decoding import JsonRecordDecoder, json_schema
from primus_dagster.data.sources.kafka.offsets import OffsetSearch

__all__ = [
    "MAX_BAD_EXAMPLES",
    "JsonRecordDecoder",
    "KafkaConfigError",
    "KafkaSource",
    "OffsetSearch",
    "json_schema",
]
