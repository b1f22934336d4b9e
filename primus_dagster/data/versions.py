"""Which data a set of tasks reads: table versions and Kafka offset ranges per source.

Recorded in every training checkpoint and in the training asset's metadata, so a model can be
traced back to the exact Delta version, Iceberg snapshot and Kafka offsets it learnt from.

Example::

    source_versions(plan.tasks)
    # {"impressions_delta": {"versions": ["12"]},
    #  "events_kafka": {"offsets": {"ctr-events:0": [0, 5210], "ctr-events:1": [0, 4977]}}}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from primus_dagster.data.tasks import DataTask


def source_versions(tasks: Iterable[DataTask]) -> dict[str, dict[str, Any]]:
    """Per source: the distinct table versions its reads pin (``versions``, sorted) and, for
    offset-ranged reads (Kafka ``topic:partition``), the covered ``[first, stop)`` per partition."""
    versions: dict[str, set[str]] = {}
    offsets: dict[str, dict[str, list[int]]] = {}
    for task in tasks:
        for read in (task.read, *task.right_reads):
            if read.version is not None:
                versions.setdefault(read.source, set()).add(str(read.version))
            if read.rows is not None and read.stop is not None and ":" in read.uri and "/" not in read.uri:
                span = offsets.setdefault(read.source, {}).setdefault(read.uri, [read.start, read.stop])
                span[0], span[1] = min(span[0], read.start), max(span[1], read.stop)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(versions) | set(offsets)):
        entry: dict[str, Any] = {}
        if name in versions:
            entry["versions"] = sorted(versions[name])
        if name in offsets:
            entry["offsets"] = dict(sorted(offsets[name].items()))
        out[name] = entry
    return out
