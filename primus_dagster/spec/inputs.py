"""Which source partitions feed a training window: the one input rule of the planner, the sensors and the asset.

A training window ``[start, end)`` (one partition of the training asset, or any window the planner is
given) reads, per source of the job:

- only the kinds the training mode trains (:data:`MODE_PHASES`, :func:`mode_kinds`);
- a **stream** source over the window itself; a **batch** source over the window shifted back by
  ``training.batch_lag`` (:func:`read_span`);
- within the dataset's ``[start, end)`` (:func:`clip_to_dataset`), every partition overlapping that span
  (:func:`partition_starts`);
- of a batch source, a partition ``[s, e)`` only when its labels are complete by the window's end:
  ``e + label_delay <= end`` (:func:`complete_at`, :func:`labels_complete`; the stream is never held back).

:func:`training_inputs` is that rule; :func:`training_span_fed_by` its inverse (the training time a
source partition feeds); :func:`dependency_offsets` and :func:`first_training_start` what the training
asset's partition mappings and partitions are built from. The spec package imports nothing
else of the project, so times are plain UTC datetimes and windows anything with ``start`` / ``end``
(:class:`Window`: ``primus_dagster.data.TimeWindow``, Dagster's ``TimeWindow``, a :class:`Span`).

Example (hourly training; a batch source read one hour behind, its labels two hours late):

>>> from datetime import datetime, timedelta, timezone
>>> from primus_dagster.spec import parse_job_spec
>>> job = parse_job_spec('''
... name: doc
... dataset:
...   start: 2026-11-01
...   streams:
...     - name: history
...       window: 1h
...       sources:
...         - {name: imp, type: parquet, kind: batch, path: i, label_delay: 2h,
...            columns: &c {ts: t, label: y, dense: [d], sparse: [u]}}
...     - name: live
...       window: 1h
...       sources: [{name: ev, type: parquet, kind: stream, path: e, columns: *c}]
... training: {mode: mixed, partition: hour, batch_lag: 1h}
... ''')
>>> t0, hours = datetime(2026, 11, 1, tzinfo=timezone.utc), lambda n: timedelta(hours=n)
>>> inputs = training_inputs(job, Span(t0 + hours(3), t0 + hours(5)))  # batch hours 2-3: hour 3 is not complete
>>> {name: [f"{s:%H}" for s in starts] for name, starts in inputs.items()}
{'imp': ['02'], 'ev': ['03', '04']}
>>> f"{complete_at(job.dataset.source('imp'), t0 + hours(3)):%H:%M}"  # its end, 04:00, + label_delay
'06:00'
>>> span = training_span_fed_by(job, job.dataset.source("imp"), t0 + hours(2))  # the inverse
>>> f"{span.start:%H}-{span.end:%H}"
'03-04'
>>> dependency_offsets(job, job.dataset.source("imp")), dependency_offsets(job, job.dataset.source("ev"))
((-1, -1), (0, 0))
>>> f"{first_training_start(job):%H:%M}"  # the first window whose lagged batch hour exists
'01:00'
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, NamedTuple, Protocol

from primus_dagster.spec.dataset import granularity_step

if TYPE_CHECKING:
    from primus_dagster.spec.dataset import DatasetSpec
    from primus_dagster.spec.job import JobSpec
    from primus_dagster.spec.sources import SourceSpec

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

#: The phases of each training mode, in order: ``(phase name, the source kinds it trains)``.
#: ``training.modes`` builds its ``Phase`` objects from this table; everything that asks which kinds a
#: mode reads (the planner, the sensors) asks :func:`mode_kinds`.
MODE_PHASES: Mapping[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "batch": (("batch", ("batch",)),),
    "stream": (("stream", ("stream",)),),
    "batch_then_stream": (("batch", ("batch",)), ("stream", ("stream",))),
    "mixed": (("mixed", ("batch", "stream")),),
}


class Window(Protocol):
    """Anything with a UTC ``start`` and ``end`` (half-open ``[start, end)``)."""

    @property
    def start(self) -> datetime: ...

    @property
    def end(self) -> datetime: ...


class Span(NamedTuple):
    """A half-open UTC time range ``[start, end)``: what the rule's functions return."""

    start: datetime
    end: datetime


def mode_phases(mode: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The ``(name, kinds)`` phases of a training mode, in order; ValueError for an unknown mode.

    >>> mode_phases("batch_then_stream")
    (('batch', ('batch',)), ('stream', ('stream',)))
    """
    try:
        return MODE_PHASES[mode]
    except KeyError:
        raise ValueError(f"unknown training mode {mode!r}; expected one of {sorted(MODE_PHASES)}") from None


def mode_kinds(mode: str) -> frozenset[str]:
    """The source kinds a training mode reads (over all its phases).

    >>> sorted(mode_kinds("mixed")), sorted(mode_kinds("stream"))
    (['batch', 'stream'], ['stream'])
    """
    return frozenset(kind for _, kinds in mode_phases(mode) for kind in kinds)


def read_lag(job: JobSpec, kind: str) -> timedelta:
    """How far behind the training window a source of ``kind`` is read: ``training.batch_lag`` for
    batch sources, nothing for stream sources."""
    return job.training.batch_lag if kind == "batch" else timedelta(0)


def read_span(job: JobSpec, kind: str, window: Window) -> Span:
    """The source time a training ``window`` reads of sources of ``kind`` (before the dataset clips it):
    the window itself (stream) or the window shifted back by the batch lag (batch)."""
    lag = read_lag(job, kind)
    return Span(window.start - lag, window.end - lag)


def clip_to_dataset(dataset: DatasetSpec, window: Window) -> Span | None:
    """``window`` within the dataset's ``[start, end)``; None when nothing is left.

    >>> from primus_dagster.spec import DatasetSpec
    >>> t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    >>> dataset = DatasetSpec.model_validate(
    ...     {"start": t0, "streams": [{"name": "s", "window": "1h", "sources": [{"name": "a", "type": "parquet",
    ...      "kind": "batch", "path": "p", "columns": {"ts": "t", "label": "y", "dense": ["d"], "sparse": ["u"]}}]}]})
    >>> clip_to_dataset(dataset, Span(t0 - timedelta(hours=2), t0 + timedelta(hours=1))).start == t0
    True
    >>> clip_to_dataset(dataset, Span(t0 - timedelta(hours=2), t0)) is None
    True
    """
    start = max(window.start, dataset.start)
    end = window.end if dataset.end is None else min(window.end, dataset.end)
    return Span(start, end) if end > start else None


def partition_starts(window: Window, granularity: str) -> list[datetime]:
    """Starts of the epoch-aligned ``hour`` / ``day`` partitions overlapping ``window``, in order.

    >>> t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    >>> [f"{s:%H:%M}" for s in partition_starts(Span(t0 + timedelta(minutes=30), t0 + timedelta(hours=2)), "hour")]
    ['00:00', '01:00']
    """
    step = granularity_step(granularity)
    current = _EPOCH + ((window.start - _EPOCH) // step) * step
    out = []
    while current < window.end:
        out.append(current)
        current += step
    return out


def complete_at(source: SourceSpec, start: datetime) -> datetime:
    """When the partition of ``source`` starting at ``start`` is complete: its end plus ``label_delay``."""
    return start + granularity_step(source.granularity) + source.label_delay


def labels_complete(source: SourceSpec, start: datetime, window_end: datetime) -> bool:
    """Whether the partition of ``source`` starting at ``start`` may feed a training window ending at
    ``window_end``: a batch partition only once complete (:func:`complete_at`) by then, a stream one always."""
    return source.kind != "batch" or complete_at(source, start) <= window_end


def source_inputs(job: JobSpec, source: SourceSpec, window: Window) -> list[datetime]:
    """The partition starts of ``source`` a training ``window`` reads, in order (the rule, one source)."""
    if source.kind not in mode_kinds(job.training.mode):
        return []
    clipped = clip_to_dataset(job.dataset, read_span(job, source.kind, window))
    starts = partition_starts(clipped, source.granularity) if clipped is not None else []
    return [s for s in starts if labels_complete(source, s, window.end)]


def training_inputs(job: JobSpec, window: Window) -> dict[str, list[datetime]]:
    """Per source of the kinds the training mode reads (spec order), the partition starts a training
    ``window`` reads, in order (see the module docstring; may be empty for a source)."""
    kinds = mode_kinds(job.training.mode)
    return {s.name: source_inputs(job, s, window) for _, s in job.dataset.all_sources() if s.kind in kinds}


def training_span_fed_by(job: JobSpec, source: SourceSpec, start: datetime) -> Span:
    """The training time the partition of ``source`` starting at ``start`` feeds: its own span (stream)
    or that span shifted forward by the batch lag (batch). The inverse of :func:`read_span`: a training
    window overlapping it reads the partition unless the mode leaves its kind out, the dataset does not
    hold it or, for a batch source, its labels are not complete by the window's end (a retrain that
    follows it is on the safe side)."""
    lag = read_lag(job, source.kind)
    return Span(start + lag, start + granularity_step(source.granularity) + lag)


def dependency_offsets(job: JobSpec, source: SourceSpec) -> tuple[int, int]:
    """``(start_offset, end_offset)`` of the training asset's ``TimeWindowPartitionMapping`` on ``source``,
    counted in training partitions (``training.partition``) as Dagster counts them: ``(0, 0)`` for a
    stream source (the same window); for a batch source the window shifted back by ``batch_lag``, its
    start rounded down and its end rounded up to whole training partitions (``-ceil(lag / T)``,
    ``-floor(lag / T)``), so that the mapped window always holds :func:`read_span`. The mapping is for
    every source whatever the mode, and cannot express label completeness: it covers at least
    :func:`training_inputs`, exactly when the lag is a whole number of training partitions, the mode
    reads the kind and the label delay leaves no partition out."""
    if source.kind != "batch":
        return 0, 0
    step = granularity_step(job.training.partition)
    lag = job.training.batch_lag
    return (lag // -step), -(lag // step)


def first_training_start(job: JobSpec) -> datetime:
    """The start of the first training partition: the dataset's start moved on by as many training
    partitions as the batch dependency reaches back (:func:`dependency_offsets`), so that the first
    window's lagged batch data is inside the dataset."""
    step = granularity_step(job.training.partition)
    return job.dataset.start + step * -(job.training.batch_lag // -step)
