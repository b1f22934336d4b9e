"""The ops of a DTGG task graph and the pure compiler from a DatasetSpec to the graph.

``Timer → DataSource → [Joiner] → Sink``: one :class:`TimerOp` per stream emits its
partition starts chronologically; one :class:`SourceOp` per *physical* source (its fusion
key: type, resolved location and every setting that changes listing or splitting) lists
partitions and splits them into read tasks for every ``(stream, source name)`` consumer it
feeds (fusion: two streams reading the same directory scan it once); a :class:`JoinerOp`
per stream with a ``join`` turns the left source's tasks into join tasks over the right
source's tasks; the :class:`SinkOp` orders all tasks chronologically for the driver.

Example::

    graph = compile_graph(job.dataset, SourceContext(data_root="/data"))
    print(graph.render())
    graph.op_for("impressions_parquet").consumers   # (("history", "impressions_parquet"), ...)
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from primus_dagster.data.sources.base import SourceContext, TimeWindow
from primus_dagster.spec.dataset import DatasetSpec, StreamSpec, granularity_step
from primus_dagster.spec.durations import format_duration
from primus_dagster.spec.sources import SourceSpec

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _norm_location(location: str) -> str:
    """``location`` with ``.``/``..``/duplicate and trailing slashes removed (URL scheme kept)."""
    scheme, sep, rest = location.partition("://")
    if not sep:
        scheme, rest = "", location
    path = posixpath.normpath(rest) if rest else rest
    return f"{scheme}://{path}" if sep else path


def _items(mapping: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(mapping.items()))


def fusion_key(spec: SourceSpec, context: SourceContext) -> tuple[Any, ...]:
    """What makes two sources the same physical scan: equal keys list and split identically.

    Names, kinds, column mappings and batch sizes are per consumer and do not matter.
    """
    if spec.type == "parquet":
        return (
            "parquet",
            _norm_location(context.resolve(spec.path)),
            spec.granularity,
            spec.layout,
            spec.template,
            spec.success_marker,
            spec.split_row_groups,
            spec.target_task_bytes if spec.split_row_groups else None,
            _items(spec.storage_options),
        )
    if spec.type == "delta":
        return (
            "delta",
            _norm_location(context.resolve(spec.uri)),
            spec.granularity,
            spec.date_column,
            spec.hour_column if spec.granularity == "hour" else None,
            _items(spec.storage_options),
        )
    if spec.type == "iceberg":
        cat = spec.catalog
        where = cat.uri or f"default-catalog@{_norm_location(context.resolve('.'))}"
        return ("iceberg", spec.table, spec.granularity, cat.name, where, cat.warehouse, _items(cat.properties))
    if spec.type == "kafka":
        servers = spec.bootstrap_servers or context.kafka_bootstrap_servers or "<kafka resource>"
        return ("kafka", spec.topic, spec.granularity, servers, spec.max_records_per_task)
    raise ValueError(f"source {spec.name!r}: unknown type {spec.type!r}")


def _location(spec: SourceSpec, context: SourceContext) -> str:
    if spec.type == "parquet":
        return _norm_location(context.resolve(spec.path))
    if spec.type == "delta":
        return _norm_location(context.resolve(spec.uri))
    if spec.type == "iceberg":
        return spec.table
    return spec.topic


def aligned_windows(window: TimeWindow, step: timedelta) -> list[TimeWindow]:
    """Consecutive epoch-aligned windows of length ``step`` covering ``window``, clipped to it."""
    first = _EPOCH + ((window.start - _EPOCH) // step) * step
    out, current = [], first
    while current < window.end:
        out.append(TimeWindow(max(current, window.start), min(current + step, window.end)))
        current += step
    return out


@dataclass(frozen=True)
class TimerOp:
    """Emits a stream's time windows (ticks of ``slide``) and the partitions inside them, in order."""

    id: str
    stream: str
    window: timedelta  # the stream's sliding-window length (what one training step sees)
    slide: timedelta
    granularities: tuple[tuple[str, str], ...]  # (source name, hour|day), spec order

    def ticks(self, window: TimeWindow) -> list[TimeWindow]:
        """The slide-aligned ticks covering ``window``, chronologically."""
        return aligned_windows(window, self.slide)

    def emit(self, window: TimeWindow) -> list[tuple[str, datetime]]:
        """``(source name, partition start)`` for every partition overlapping ``window``, tick by
        tick (chronological); a partition spanning several ticks is emitted at its first."""
        seen: set[tuple[str, datetime]] = set()
        out: list[tuple[str, datetime]] = []
        for tick in self.ticks(window):
            batch = []
            for name, gran in self.granularities:
                for start in tick.partition_starts(gran):
                    if (name, start) not in seen:
                        seen.add((name, start))
                        batch.append((start, name))
            batch.sort(key=lambda item: item[0])  # stable: spec order within one start
            out += [(name, start) for start, name in batch]
        return out


@dataclass(frozen=True)
class SourceOp:
    """One physical scan; feeds every ``(stream, source name)`` in ``consumers``."""

    id: str
    key: tuple[Any, ...]
    type: str
    location: str
    granularity: str
    consumers: tuple[tuple[str, str], ...]

    @property
    def step(self) -> timedelta:
        return granularity_step(self.granularity)

    @property
    def fused(self) -> bool:
        return len(self.consumers) > 1


@dataclass(frozen=True)
class JoinerOp:
    """Joins ``left`` (samples) with ``right`` (late events) by ``key`` within ``lateness``."""

    id: str
    stream: str
    left: str
    right: str
    key: str
    lateness: timedelta


@dataclass(frozen=True)
class SinkOp:
    """Orders every data task chronologically (``DataTask.order_key``) for the driver."""

    id: str = "sink"


Op = TimerOp | SourceOp | JoinerOp | SinkOp


@dataclass
class TaskGraph:
    """Nodes by id (insertion order: timers, sources, joiners, sink) and labelled edges."""

    dataset: DatasetSpec
    nodes: dict[str, Op] = field(default_factory=dict)
    edges: list[tuple[str, str, str]] = field(default_factory=list)  # (from, to, label)
    source_of: dict[str, str] = field(default_factory=dict)  # source name -> SourceOp id

    def ops(self, kind: type) -> list[Any]:
        return [op for op in self.nodes.values() if isinstance(op, kind)]

    @property
    def timers(self) -> list[TimerOp]:
        return self.ops(TimerOp)

    @property
    def sources(self) -> list[SourceOp]:
        return self.ops(SourceOp)

    @property
    def joiners(self) -> list[JoinerOp]:
        return self.ops(JoinerOp)

    def op_for(self, source_name: str) -> SourceOp:
        return self.nodes[self.source_of[source_name]]  # type: ignore[return-value]

    def joiner_of(self, stream: str) -> JoinerOp | None:
        op = self.nodes.get(f"join:{stream}")
        return op if isinstance(op, JoinerOp) else None

    def to_dict(self) -> dict[str, Any]:
        nodes: list[dict[str, Any]] = []
        for op in self.nodes.values():
            if isinstance(op, TimerOp):
                nodes.append(
                    {
                        "id": op.id,
                        "op": "timer",
                        "stream": op.stream,
                        "window": format_duration(op.window),
                        "slide": format_duration(op.slide),
                        "sources": [list(g) for g in op.granularities],
                    }
                )
            elif isinstance(op, SourceOp):
                nodes.append(
                    {
                        "id": op.id,
                        "op": "source",
                        "type": op.type,
                        "location": op.location,
                        "granularity": op.granularity,
                        "fused": op.fused,
                        "consumers": [{"stream": s, "source": n} for s, n in op.consumers],
                    }
                )
            elif isinstance(op, JoinerOp):
                nodes.append(
                    {
                        "id": op.id,
                        "op": "joiner",
                        "stream": op.stream,
                        "left": op.left,
                        "right": op.right,
                        "key": op.key,
                        "lateness": format_duration(op.lateness),
                    }
                )
            else:
                nodes.append({"id": op.id, "op": "sink"})
        return {"nodes": nodes, "edges": [{"from": a, "to": b, "label": label} for a, b, label in self.edges]}

    def render(self) -> str:
        sources = self.sources
        fused = sum(1 for op in sources if op.fused)
        consumers = sum(len(op.consumers) for op in sources)
        lines = [
            f"DTGG graph: {len(self.timers)} timer(s), {len(sources)} source op(s) for {consumers} "
            f"consumer(s) ({fused} fused), {len(self.joiners)} joiner(s), 1 sink"
        ]
        for op in self.nodes.values():
            if isinstance(op, TimerOp):
                lines.append(f"  {op.id}  window={format_duration(op.window)} slide={format_duration(op.slide)}")
            elif isinstance(op, SourceOp):
                who = ", ".join(f"{s}/{n}" for s, n in op.consumers)
                lines.append(f"  {op.id}  per {op.granularity}{'  FUSED' if op.fused else ''}  feeds: {who}")
            elif isinstance(op, JoinerOp):
                lines.append(f"  {op.id}  {op.left} ⋈ {op.right} on {op.key}, lateness {format_duration(op.lateness)}")
            else:
                lines.append(f"  {op.id}")
        lines.append("  edges:")
        lines += [f"    {a} -> {b}" + (f"  [{label}]" if label else "") for a, b, label in self.edges]
        return "\n".join(lines)


def _slide(stream: StreamSpec) -> timedelta:
    if stream.slide is not None:
        return stream.slide
    return max(granularity_step(s.granularity) for s in stream.sources)


def compile_graph(dataset: DatasetSpec, context: SourceContext) -> TaskGraph:
    """The task graph of ``dataset``: pure (no I/O); sources with equal fusion keys share one op."""
    graph = TaskGraph(dataset)
    for stream in dataset.streams:
        timer = TimerOp(
            f"timer:{stream.name}",
            stream.name,
            stream.window,
            _slide(stream),
            tuple((s.name, s.granularity) for s in stream.sources),
        )
        graph.nodes[timer.id] = timer
    by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    for stream, source in dataset.all_sources():
        key = fusion_key(source, context)
        entry = by_key.setdefault(key, {"spec": source, "consumers": []})
        entry["consumers"].append((stream.name, source.name))
    used_ids: set[str] = set()
    for key, entry in by_key.items():
        spec = entry["spec"]
        base = f"source:{spec.type}:{_location(spec, context)}"
        op_id, n = base, 2
        while op_id in used_ids:  # same location, different listing settings: still two scans
            op_id, n = f"{base}#{n}", n + 1
        used_ids.add(op_id)
        op = SourceOp(op_id, key, spec.type, _location(spec, context), spec.granularity, tuple(entry["consumers"]))
        graph.nodes[op.id] = op
        for _, name in op.consumers:
            graph.source_of[name] = op.id
    for stream in dataset.streams:
        if stream.join is not None:
            j = stream.join
            join_op = JoinerOp(f"join:{stream.name}", stream.name, j.left, j.right, j.key, j.lateness)
            graph.nodes[join_op.id] = join_op
    sink = SinkOp()
    graph.nodes[sink.id] = sink
    for stream in dataset.streams:
        joiner = graph.joiner_of(stream.name)
        for source in stream.sources:
            op_id = graph.source_of[source.name]
            graph.edges.append((f"timer:{stream.name}", op_id, source.name))
            if joiner is not None and source.name in (joiner.left, joiner.right):
                side = "left" if source.name == joiner.left else "right"
                graph.edges.append((op_id, joiner.id, f"{source.name} ({side})"))
            else:
                graph.edges.append((op_id, sink.id, f"{stream.name}/{source.name}"))
        if joiner is not None:
            graph.edges.append((joiner.id, sink.id, stream.name))
    return graph
