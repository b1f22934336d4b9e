"""Executor metrics for scaling: samples, short bounded time series, utilisations and pool aggregates.

A :class:`Sample` is what one executor used at one moment (CPU cores busy, RSS, IO, buffer fill,
rows/s and, for trainers, the fraction of time its reader waited on an empty queue) next to what
it is allocated. Its utilisation ``u_k`` for a metric ``k`` is used / allocated: CPU cores busy /
cores allocated, RSS / memory allocated, IO bytes/s / an IO capacity, buffer fill as is (0..1).
:class:`MetricsStore` keeps a bounded deque of samples per executor (max samples, max age) and
aggregates the latest sample of each executor of a pool by ``mean`` or ``max`` (the
:class:`~primus_dagster.spec.MetricSpec` ``aggregation``).

Data executors send ``metrics`` with every heartbeat (``rows_per_s``, ``batches_per_s``, ``cpu``,
``rss_bytes``, ``buffer_fill``, ``tasks_running``); :func:`sample_from_heartbeat` turns one into a
:class:`Sample`.

Example::

    store = MetricsStore(max_samples=32, max_age_s=600)
    alloc = Resources(cpu=2.0, memory_bytes=4 << 30)
    store.add(sample_from_heartbeat("data-0", "data", {"cpu": 1.5, "rss_bytes": 2 << 30}, alloc, now=10.0))
    store.pool_utilisation("data", "cpu", "mean", now=10.0)      # 0.75
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from primus_dagster.cluster.pool import Resources, Role

MetricName = Literal["buffer_fill", "cpu", "memory", "io"]
Aggregation = Literal["mean", "max"]
#: The utilisation signals u_k of the horizontal load metric, as the spec names them.
METRIC_NAMES: tuple[MetricName, ...] = ("buffer_fill", "cpu", "memory", "io")
#: Default IO capacity of one executor (bytes/s) against which ``io`` utilisation is measured.
DEFAULT_IO_CAPACITY = 200e6


@dataclass(frozen=True)
class Sample:
    """What executor ``executor_id`` used at ``time`` (seconds, the controller's clock) and what it is
    ``allocated``. ``io_bytes_per_s``, ``buffer_fill`` and ``reader_wait`` are None when the executor
    does not report them (trainers have no data buffer, data executors no reader).

    Example::

        s = Sample(5.0, "data-0", "data", Resources(2.0, 4 << 30), cpu=1.0, rss_bytes=1 << 30, buffer_fill=0.5)
        s.utilisation("cpu"), s.utilisation("memory")     # (0.5, 0.25)
    """

    time: float
    executor_id: str
    role: Role
    allocated: Resources
    cpu: float = 0.0
    rss_bytes: float = 0.0
    io_bytes_per_s: float | None = None
    buffer_fill: float | None = None
    rows_per_s: float = 0.0
    reader_wait: float | None = None

    def utilisation(self, metric: MetricName, io_capacity: float = DEFAULT_IO_CAPACITY) -> float | None:
        """u_k of this sample: used / allocated (None when the executor does not report ``metric``)."""
        if metric == "cpu":
            return self.cpu / self.allocated.cpu
        if metric == "memory":
            return self.rss_bytes / self.allocated.memory_bytes if self.allocated.memory_bytes else None
        if metric == "io":
            return None if self.io_bytes_per_s is None else self.io_bytes_per_s / io_capacity
        return self.buffer_fill


def _number(metrics: Mapping[str, float], key: str) -> float | None:
    value = metrics.get(key)
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _fraction(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, value))


def sample_from_heartbeat(
    executor_id: str,
    role: Role,
    metrics: Mapping[str, float],
    allocated: Resources,
    *,
    now: float,
    io_bytes_per_s: float | None = None,
    reader_wait: float | None = None,
) -> Sample:
    """A :class:`Sample` from an executor's heartbeat ``metrics`` (the keys of
    ``DataExecutor.metrics()``; missing or non-finite values count as 0 / not reported).
    ``io_bytes_per_s`` and ``reader_wait`` come from the caller (psutil IO counters, the trainer's
    reader) when the heartbeat lacks them; ``buffer_fill`` and ``reader_wait`` are clipped to 0..1.

    >>> s = sample_from_heartbeat("d0", "data", {"cpu": 3.0, "rss_bytes": 1e9, "buffer_fill": 1.2},
    ...                           Resources(4.0, 2 << 30), now=1.0)
    >>> s.utilisation("cpu"), s.buffer_fill
    (0.75, 1.0)
    """
    io = _number(metrics, "io_bytes_per_s")
    wait = _number(metrics, "reader_wait")
    return Sample(
        time=now,
        executor_id=executor_id,
        role=role,
        allocated=allocated,
        cpu=max(0.0, _number(metrics, "cpu") or 0.0),
        rss_bytes=max(0.0, _number(metrics, "rss_bytes") or 0.0),
        io_bytes_per_s=io_bytes_per_s if io_bytes_per_s is not None else io,
        buffer_fill=_fraction(_number(metrics, "buffer_fill")),
        rows_per_s=max(0.0, _number(metrics, "rows_per_s") or 0.0),
        reader_wait=_fraction(reader_wait if reader_wait is not None else wait),
    )


def aggregate(values: np.ndarray, aggregation: Aggregation) -> float | None:
    """``mean`` or ``max`` of the finite ``values`` (NaN = not reported); None when there are none.

    >>> aggregate(np.array([0.2, np.nan, 0.6]), "mean"), aggregate(np.array([0.2, 0.6]), "max")
    (0.4, 0.6)
    """
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    return float(finite.mean() if aggregation == "mean" else finite.max())


class ExecutorSeries:
    """The recent samples of one executor, oldest first: at most ``max_samples``, none older than
    ``max_age_s`` before the newest.

    Example::

        series = ExecutorSeries(max_samples=3, max_age_s=60)
        for t in range(5):
            series.add(Sample(float(t), "d0", "data", Resources(1.0, 1 << 30), cpu=0.1 * t))
        [s.time for s in series]        # [2.0, 3.0, 4.0]
    """

    def __init__(self, max_samples: int = 32, max_age_s: float = 600.0):
        if max_samples < 1 or max_age_s <= 0:
            raise ValueError(f"need max_samples >= 1 and max_age_s > 0, got {max_samples}, {max_age_s}")
        self.max_age_s = max_age_s
        self._samples: deque[Sample] = deque(maxlen=max_samples)

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)
        self.prune(sample.time)

    def prune(self, now: float) -> None:
        """Drop samples older than ``max_age_s`` before ``now``."""
        while self._samples and now - self._samples[0].time > self.max_age_s:
            self._samples.popleft()

    @property
    def latest(self) -> Sample | None:
        return self._samples[-1] if self._samples else None

    def values(self, field_name: str) -> np.ndarray:
        """One numeric field of every sample, oldest first (None as NaN)."""
        return np.array([np.nan if (v := getattr(s, field_name)) is None else v for s in self._samples], dtype=float)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


class MetricsStore:
    """An :class:`ExecutorSeries` per executor, and pool aggregates of their latest samples.

    Example::

        store = MetricsStore()
        store.add(Sample(1.0, "d0", "data", Resources(2.0, 1 << 30), cpu=2.0))
        store.add(Sample(1.0, "d1", "data", Resources(2.0, 1 << 30), cpu=1.0))
        store.pool_utilisation("data", "cpu", "max", now=1.0)     # 1.0
    """

    def __init__(self, max_samples: int = 32, max_age_s: float = 600.0, io_capacity: float = DEFAULT_IO_CAPACITY):
        self.max_samples = max_samples
        self.max_age_s = max_age_s
        self.io_capacity = io_capacity
        self._series: dict[str, ExecutorSeries] = {}
        self._roles: dict[str, Role] = {}

    def add(self, sample: Sample) -> None:
        series = self._series.get(sample.executor_id)
        if series is None:
            series = self._series[sample.executor_id] = ExecutorSeries(self.max_samples, self.max_age_s)
        self._roles[sample.executor_id] = sample.role
        series.add(sample)

    def series(self, executor_id: str) -> ExecutorSeries | None:
        return self._series.get(executor_id)

    def latest(self, executor_id: str) -> Sample | None:
        series = self._series.get(executor_id)
        return series.latest if series is not None else None

    def remove(self, executor_id: str) -> None:
        """Forget an executor (removed from its pool)."""
        self._series.pop(executor_id, None)
        self._roles.pop(executor_id, None)

    def executors(self, role: Role | None = None) -> list[str]:
        return [e for e, r in self._roles.items() if role is None or r == role]

    def prune(self, now: float) -> None:
        """Drop samples older than ``max_age_s`` and executors left with none."""
        for executor_id in list(self._series):
            series = self._series[executor_id]
            series.prune(now)
            if not len(series):
                self.remove(executor_id)

    def fresh(self, role: Role, now: float) -> list[Sample]:
        """The latest sample of every executor of ``role`` that is at most ``max_age_s`` old."""
        out = []
        for executor_id in self.executors(role):
            sample = self._series[executor_id].latest
            if sample is not None and now - sample.time <= self.max_age_s:
                out.append(sample)
        return out

    def pool_utilisation(self, role: Role, metric: MetricName, aggregation: Aggregation, now: float) -> float | None:
        """u_k of pool ``role``: ``aggregation`` over its executors' latest (fresh) samples;
        None when no executor reports ``metric``."""
        values = [s.utilisation(metric, self.io_capacity) for s in self.fresh(role, now)]
        return aggregate(np.array([np.nan if v is None else v for v in values], dtype=float), aggregation)

    def __len__(self) -> int:
        return len(self._series)
