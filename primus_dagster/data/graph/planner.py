"""The DTGG planner: runs a compiled task graph over a time window (the I/O half of DTGG).

Timer ops emit each stream's partition starts chronologically; every ``(SourceOp, start)``
not in the :class:`ListingCache` becomes a work item on a thread pool of ``threads`` workers
(Parquet: one directory listing per partition; Delta / Iceberg / Kafka: one call per
contiguous run of partitions, as their metadata is read once per call anyway). A worker calls
``adapter.partitions(window)`` then ``adapter.split(partition)`` for the ready ones and
packs the tasks into a :class:`TaskBlock` (cached). The Joiner turns a ready left partition
into join tasks once the right source is ready over ``[start, end + lateness)``; the Sink
orders everything by ``DataTask.order_key``. With a :class:`PackRule` (``Planner.for_job``: the
job's ``data.pack_bytes`` / ``data.open_cost_bytes``) the small files of a Parquet, Delta or
Iceberg partition are packed into fewer tasks.

Example::

    with Planner(job.dataset, SourceContext("/data"), threads=job.data.planner_threads) as planner:
        plan = planner.plan(TimeWindow.hours_from(start, 24))
        later = planner.plan(TimeWindow.hours_from(start + timedelta(hours=1), 24))  # lists 1 hour
    for task in plan.tasks: ...
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from primus_dagster.data.graph.listing_cache import ListingCache, PackRule, TaskBlock
from primus_dagster.data.graph.ops import SourceOp, TaskGraph, compile_graph
from primus_dagster.data.graph.plan import (
    ConsumerCount,
    NotReady,
    NotReadyState,
    Plan,
    PlanStats,
    Segment,
    TaskSequence,
)
from primus_dagster.data.sources.base import SourceAdapter, SourceContext, TimeWindow
from primus_dagster.data.sources.registry import make_adapter
from primus_dagster.data.tasks import JoinInfo
from primus_dagster.spec.dataset import DatasetSpec, granularity_step
from primus_dagster.spec.inputs import clip_to_dataset
from primus_dagster.spec.sources import SourceSpec

AdapterFactory = Callable[[SourceSpec, SourceContext], SourceAdapter]

# Types whose adapters list a whole window from one metadata read: one call per contiguous run.
BATCHED_TYPES = frozenset({"delta", "iceberg", "kafka"})
# Types with a table version to pin (the cache key's version; read once per plan).
VERSIONED_TYPES = frozenset({"delta", "iceberg"})
# Adapters known to be safe to call from several threads at once (fsspec listings).
THREAD_SAFE_TYPES = frozenset({"parquet"})
# Types whose tasks are files: their small files are packed (PackRule).
FILE_TYPES = frozenset({"parquet", "delta", "iceberg"})


class _Listed:
    """One (op, partition) outcome: a ready block, or not ready / error with a reason."""

    __slots__ = ("block", "reason", "state")

    def __init__(self, block: TaskBlock | None = None, reason: str | None = None, state: NotReadyState = "not_ready"):
        self.block, self.reason, self.state = block, reason, state


def clip_window(dataset: DatasetSpec, window: TimeWindow) -> TimeWindow | None:
    """``window`` intersected with the dataset's ``[start, end)`` (:func:`primus_dagster.spec.clip_to_dataset`);
    None when they do not meet."""
    clipped = clip_to_dataset(dataset, window)
    return None if clipped is None else TimeWindow(clipped.start, clipped.end)


class Planner:
    """Plans windows of ``dataset`` with ``threads`` listing workers (see module docstring); ``pack``:
    how small files are packed into one task (None: a task per file)."""

    def __init__(
        self,
        dataset: DatasetSpec,
        context: SourceContext,
        threads: int = 4,
        cache: ListingCache | None = None,
        adapter_factory: AdapterFactory = make_adapter,
        pack: PackRule | None = None,
    ):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.dataset, self.context, self.threads = dataset, context, threads
        self.pack = pack
        self.cache = cache if cache is not None else ListingCache()
        self.adapter_factory = adapter_factory
        self.graph: TaskGraph = compile_graph(dataset, context)
        self._specs: dict[str, SourceSpec] = {}
        for op in self.graph.sources:
            self._specs[op.id] = dataset.source(op.consumers[0][1])
        self._adapters: dict[str, SourceAdapter] = {}
        self._create_lock = threading.Lock()
        self._op_locks = {op.id: threading.Lock() for op in self.graph.sources}

    @classmethod
    def for_job(cls, job: Any, context: SourceContext, **kwargs: Any) -> Planner:
        """A planner for a :class:`JobSpec`, sized by ``job.data.planner_threads``, packing small files by
        ``job.data.pack_bytes`` and ``job.data.open_cost_bytes`` (off when ``pack_bytes`` is 0)."""
        kwargs.setdefault("threads", job.data.planner_threads)
        if job.data.pack_bytes:
            kwargs.setdefault("pack", PackRule(job.data.pack_bytes, job.data.open_cost_bytes))
        return cls(job.dataset, context, **kwargs)

    # ---- adapters ----------------------------------------------------------------------
    def adapter(self, op: SourceOp) -> SourceAdapter:
        """The one adapter of ``op`` (created on first use, shared by the workers)."""
        adapter = self._adapters.get(op.id)
        if adapter is None:
            with self._create_lock:
                adapter = self._adapters.get(op.id)
                if adapter is None:
                    adapter = self.adapter_factory(self._specs[op.id], self.context)
                    self._adapters[op.id] = adapter
        return adapter

    def close(self) -> None:
        for adapter in self._adapters.values():
            adapter.close()
        self._adapters.clear()

    def __enter__(self) -> Planner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- work items ----------------------------------------------------------------------
    def _version(self, op: SourceOp) -> str | None:
        if op.type not in VERSIONED_TYPES:
            return None
        try:
            with self._lock_for(op):
                return self.adapter(op).version()
        except Exception:  # the listing reports the error with its partitions
            return None

    def _lock_for(self, op: SourceOp) -> Any:
        return nullcontext() if op.type in THREAD_SAFE_TYPES else self._op_locks[op.id]

    def _list(self, op: SourceOp, starts: list[datetime]) -> list[tuple[datetime, _Listed]]:
        """List ``starts`` (contiguous) of ``op``; split and cache the ready partitions."""
        out: dict[datetime, _Listed] = {}
        wanted = set(starts)
        try:
            adapter = self.adapter(op)
            with self._lock_for(op):
                parts = adapter.partitions(TimeWindow(starts[0], starts[-1] + op.step))
                for part in parts:
                    if part.start not in wanted:
                        continue
                    if not part.ready:
                        out[part.start] = _Listed(reason=part.reason or "not ready")
                        continue
                    try:
                        block = TaskBlock.from_tasks(part.start, part.version, adapter.split(part))
                    except Exception as exc:  # reported with the partition
                        out[part.start] = _Listed(reason=f"split failed: {type(exc).__name__}: {exc}", state="error")
                        continue
                    self.cache.put(op.key, part.start, part.version, block)
                    out[part.start] = _Listed(block)
        except Exception as exc:  # reported with each partition of the item
            reason = f"listing failed: {type(exc).__name__}: {exc}"
            return [(s, out.get(s) or _Listed(reason=reason, state="error")) for s in starts]
        missing = _Listed(reason="the adapter returned no such partition", state="error")
        return [(s, out.get(s, missing)) for s in starts]

    def _work_items(self, op: SourceOp, starts: list[datetime]) -> list[list[datetime]]:
        if op.type not in BATCHED_TYPES:
            return [[s] for s in starts]
        runs: list[list[datetime]] = []
        for s in sorted(starts):
            if runs and runs[-1][-1] + op.step == s:
                runs[-1].append(s)
            else:
                runs.append([s])
        return runs

    # ---- the plan ------------------------------------------------------------------------
    def plan(self, window: TimeWindow) -> Plan:
        """Tasks of every stream for the partitions overlapping ``window`` (clipped to the dataset)."""
        t0 = time.perf_counter()
        graph, stats = self.graph, PlanStats(threads=self.threads)
        consumer_starts: dict[tuple[str, str], list[datetime]] = {}
        needed: dict[str, dict[datetime, None]] = {op.id: {} for op in graph.sources}
        clipped = clip_window(self.dataset, window)
        for timer in graph.timers:
            for name, start in timer.emit(clipped) if clipped is not None else []:
                consumer_starts.setdefault((timer.stream, name), []).append(start)
                needed[graph.source_of[name]][start] = None
        for joiner in graph.joiners:
            left_step = granularity_step(self.dataset.source(joiner.left).granularity)
            right_op = graph.op_for(joiner.right)
            for start in consumer_starts.get((joiner.stream, joiner.left), []):
                cover = TimeWindow(start, start + left_step + joiner.lateness)
                for r in cover.partition_starts(right_op.granularity):
                    needed[right_op.id][r] = None

        ops = [op for op in graph.sources if needed[op.id]]
        results: dict[tuple[str, datetime], _Listed] = {}
        items: list[tuple[datetime, SourceOp, list[datetime]]] = []
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="dtgg") as pool:
            versioned = [op for op in ops if op.type in VERSIONED_TYPES]
            versions = dict(zip([op.id for op in versioned], pool.map(self._version, versioned), strict=True))
            stats.version_calls = len(versioned)
            for op in ops:
                misses = []
                for start in needed[op.id]:
                    block = self.cache.get(op.key, start, versions.get(op.id))
                    if block is None:
                        misses.append(start)
                    else:
                        results[(op.id, start)] = _Listed(block)
                        stats.cache_hits += 1
                items += [(run[0], op, run) for run in self._work_items(op, misses)]
            items.sort(key=lambda item: item[0])  # chronological generation, across sources
            futures = [(op, pool.submit(self._list, op, run)) for _, op, run in items]
            for op, future in futures:
                stats.listings += 1
                for start, listed in future.result():
                    stats.listed_partitions += 1
                    results[(op.id, start)] = listed
        for listed in results.values():
            if listed.block is not None:
                stats.files += len(listed.block)
                stats.bytes += listed.block.bytes

        segments, not_ready, counts = self._assemble(consumer_starts, results)
        tasks = TaskSequence(segments)
        stats.tasks = len(tasks)
        stats.seconds = time.perf_counter() - t0
        return Plan(window, graph, tasks, not_ready, counts, stats)

    def _usable(self, listed: _Listed, spec: SourceSpec) -> tuple[bool, str, NotReadyState]:
        if listed.block is None:
            return False, listed.reason or "not ready", listed.state
        if not len(listed.block) and not spec.allow_empty:
            return False, "ready but empty (set allow_empty: true if that is expected)", "error"
        return True, "", "not_ready"  # the state is only read when not usable

    def _assemble(
        self, consumer_starts: dict[tuple[str, str], list[datetime]], results: dict[tuple[str, datetime], _Listed]
    ) -> tuple[list[Segment], list[NotReady], dict[tuple[str, str], ConsumerCount]]:
        graph = self.graph
        segments: list[Segment] = []
        not_ready: list[NotReady] = []
        counts: dict[tuple[str, str], ConsumerCount] = {}
        for stream in self.dataset.streams:
            joiner = graph.joiner_of(stream.name)
            for source in stream.sources:
                count = counts.setdefault((stream.name, source.name), ConsumerCount())
                op_id = graph.source_of[source.name]
                for start in consumer_starts.get((stream.name, source.name), []):
                    listed = results[(op_id, start)]
                    ok, reason, state = self._usable(listed, source)
                    if not ok:
                        count.not_ready_partitions += 1
                        not_ready.append(NotReady(stream.name, source.name, start, reason, state))
                        continue
                    assert listed.block is not None
                    if joiner is not None and source.name == joiner.right:
                        count.ready_partitions += 1  # feeds the joiner only
                        continue
                    join: JoinInfo | None = None
                    right: tuple[TaskBlock, ...] = ()
                    if joiner is not None and source.name == joiner.left:
                        right_spec = self.dataset.source(joiner.right)
                        end = start + granularity_step(source.granularity) + joiner.lateness
                        blocks: list[TaskBlock] = []
                        waiting = False
                        for r in TimeWindow(start, end).partition_starts(right_spec.granularity):
                            r_listed = results[(graph.source_of[joiner.right], r)]
                            r_ok, r_reason, _ = self._usable(r_listed, right_spec)
                            if not r_ok:
                                waiting = True
                                reason = (
                                    f"waiting for {joiner.right} up to {end.isoformat()} (lateness "
                                    f"{joiner.lateness}): partition {r.isoformat()}: {r_reason}"
                                )
                                break
                            assert r_listed.block is not None
                            blocks.append(r_listed.block)
                        if waiting:
                            count.not_ready_partitions += 1
                            not_ready.append(NotReady(stream.name, source.name, start, reason, "waiting"))
                            continue
                        join = JoinInfo(joiner.left, joiner.right, joiner.key, joiner.lateness.total_seconds())
                        right = tuple(blocks)
                    pack = self.pack if source.type in FILE_TYPES else None
                    segment = Segment(stream.name, source.kind, source.name, listed.block, join, right, pack)
                    count.ready_partitions += 1
                    count.tasks += len(segment)
                    count.bytes += listed.block.bytes
                    segments.append(segment)
        not_ready.sort(key=lambda p: (p.partition, p.stream, p.source))
        return segments, not_ready, counts
