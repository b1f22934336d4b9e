"""What one task outputs: its canonical batches, in a deterministic order (reads and joins).

A read task is its adapter's batches. A join task reads the right side's events (only the key
and ``ts`` columns) once, then labels each left batch with
:func:`primus_dagster.data.graph.join_labels` -- batch by batch, so the output batches line up
with the left batches and a re-run numbers its rows identically. Executors number these rows
into :class:`~primus_dagster.data.batch.Batch` es; :func:`read_batches` reads a few tasks in this
process instead (evaluation on held-out hours, audits), without a data plane.

Example::

    for arrow_batch in task_batches(task, adapter_for):
        ...
    for batch in read_batches(job, context, tasks):     # Batch, kind and stream from the task
        ...
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator

import pyarrow as pa

from primus_dagster.data.batch import Batch
from primus_dagster.data.canonical import TS_TYPE
from primus_dagster.data.sources import SourceAdapter, SourceContext, make_adapter
from primus_dagster.data.sources.base import pack_failure
from primus_dagster.data.tasks import BatchId, DataTask
from primus_dagster.spec import JobSpec

AdapterFor = Callable[[str], SourceAdapter]


def _right_events(task: DataTask, adapter_for: AdapterFor, key: str) -> list[pa.RecordBatch]:
    out = []
    for read in task.right_reads:
        adapter = adapter_for(read.source)
        for batch in adapter.read(read):
            missing = [c for c in (key, "ts") if c not in batch.schema.names]
            if missing:
                raise KeyError(
                    f"join {task.task_id}: right source {read.source} ({read.uri}) has no canonical "
                    f"column(s) {missing}; the join key must be a canonical column (e.g. sample_id)"
                )
            out.append(batch.select([key, "ts"]))
    return out


def task_batches(task: DataTask, adapter_for: AdapterFor) -> Iterator[pa.RecordBatch]:
    """The canonical output batches of ``task`` (see module docstring)."""
    left = adapter_for(task.read.source).read(task.read)
    if task.join is None:
        yield from left
        return
    from primus_dagster.data.graph import join_labels

    info = task.join
    right_batches = _right_events(task, adapter_for, info.key)
    right: pa.Table | None = None
    for batch in left:
        if batch.num_rows == 0:
            continue
        if info.key not in batch.schema.names:
            raise KeyError(
                f"join {task.task_id}: left source {task.read.source} ({task.read.uri}) has no canonical "
                f"column {info.key!r}; the join key must be a canonical column (e.g. sample_id)"
            )
        if right is None:
            key_type = batch.schema.field(info.key).type
            empty = pa.schema([pa.field(info.key, key_type), pa.field("ts", TS_TYPE)])
            right = pa.Table.from_batches(right_batches, schema=right_batches[0].schema if right_batches else empty)
        joined = join_labels(pa.Table.from_batches([batch]), right, info)
        yield from joined.combine_chunks().to_batches()


def read_batches(
    job: JobSpec,
    context: SourceContext,
    tasks: Iterable[DataTask],
    on_error: Callable[[DataTask, Exception], None] | None = None,
) -> Generator[Batch, None, None]:
    """The non-empty output batches of ``tasks``, read in this process through the source adapters
    (numbered as an executor numbers them). ``on_error``: a task whose read fails is handed to it with the
    error and the next task is read -- a pack goes on without the file that failed
    (:func:`~primus_dagster.data.sources.base.pack_failure`) -- a best-effort sample (the data plane
    retries and reports such tasks); None: the error is raised."""
    adapters: dict[str, SourceAdapter] = {}

    def adapter_for(name: str) -> SourceAdapter:
        if name not in adapters:
            adapters[name] = make_adapter(job.dataset.source(name), context)
        return adapters[name]

    try:
        for task in tasks:
            reading, done = task, 0  # rows handed out: a read again without a failed file skips them
            while True:
                first = 0
                try:
                    for arrow_batch in task_batches(reading, adapter_for):
                        n = arrow_batch.num_rows
                        if n and first >= done:
                            batch_id = BatchId(task.task_id, first, n)
                            yield Batch.from_arrow(
                                arrow_batch,
                                kind=task.kind,
                                stream=task.stream,
                                source=task.read.source,
                                batch_id=batch_id,
                            )
                            done = first + n
                        first += n
                except Exception as exc:
                    if on_error is None:
                        raise
                    on_error(task, exc)
                    failure = pack_failure(exc)  # one file of a pack: the others are read without it
                    if failure is not None and len(reading.read.members) > 1:
                        reading = reading.without([failure.member])
                        continue
                break
    finally:
        for adapter in adapters.values():
            adapter.close()
