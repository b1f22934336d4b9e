"""The data executor: task runners, per-trainer buffers, heartbeats and the dataset server.

A :class:`DataExecutor` runs ``task_runners`` threads. Each leases a task from the driver (only
when a buffer it may fill has room and no other runner is waiting for room), reads it through
the source's adapter (a join task: left batches labelled from the right events, see
``reading``), numbers the output rows to give every batch its ``BatchId(task_id, first_row,
rows)`` (the same on every re-run), skips the batches the lease says are already claimed, and
puts the rest into the trainer buffer its stream's shuffle picks -- with ``data.deterministic`` and
several trainers, the one each batch is fixed to (``shuffle.ordered_trainer``) -- (blocking while full:
backpressure). A task is *completed* at the driver once every one of its batches has been handed
to a ``DoGet`` stream (so an executor that dies with batches still buffered leaves its tasks to
be re-leased); a read error *fails* it (with the file/URI in the message; one file of a pack of
small files fails as that file, which the driver may give up alone: ``docs/data_plane.md``, Packs).
A heartbeat thread reports every ``lease/4`` with metrics and cancels tasks the driver says this
executor lost.

Example::

    executor = DataExecutor(driver, job, "data-0", data_root="/data", trainers=2)
    with executor:                     # starts the Flight server, heartbeats and runners
        print(executor.location)       # grpc://127.0.0.1:PORT, also sent with heartbeats
        executor.wait()                # until the driver is done and the buffers are drained
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from primus_dagster.data.batch import Batch, BatchMeta
from primus_dagster.data.canonical import OPTIONAL_FIELDS, check_fields, is_permanent, split_dense
from primus_dagster.data.driver.api import BUFFERED_ROWS, Completion, DriverAPI, ExecutorReport, Lease, MemberFailure
from primus_dagster.data.executor.buffers import TrainerBuffers
from primus_dagster.data.executor.dataset_server import DatasetServer
from primus_dagster.data.executor.metrics import RateMeter
from primus_dagster.data.flight_protocol import conform
from primus_dagster.data.shuffle import FixedShuffle, Shuffle, executor_index_from_id, make_shuffle, ordered_trainer
from primus_dagster.data.sources import SourceAdapter, SourceContext, make_adapter
from primus_dagster.data.sources.base import pack_failure
from primus_dagster.data.task_batches import task_batches
from primus_dagster.data.tasks import BatchId, DataTask
from primus_dagster.spec import JobSpec

log = logging.getLogger(__name__)

# A queued completion waits at most about this long for a lease to ride with (then it goes alone).
_COMPLETION_DELAY_S = 0.1


@dataclass
class _TaskRun:
    lease: Lease
    outstanding: int = 0  # batches buffered or in a DoGet, not yet handed over
    rows: int = 0
    batches: int = 0
    read_done: bool = False
    cancelled: bool = False
    finished: bool = False  # complete/fail sent (or abandoned)
    quality: dict[str, int] = field(default_factory=dict)  # rows touched per data-quality rule
    places: dict[str, dict[str, int]] = field(default_factory=dict)  # the same per file of a pack
    quality_columns: dict[str, list[str]] = field(default_factory=dict)  # rule -> native columns that broke it


@dataclass
class _Counters:
    rows_read: int = 0
    batches_read: int = 0
    rows_served: int = 0
    tasks_completed: int = 0
    tasks_failed: int = 0
    errors: list[str] = field(default_factory=list)


class DataExecutor:
    """One data executor (see module docstring); thread-safe, restartable only by a new instance."""

    def __init__(
        self,
        driver: DriverAPI,
        job: JobSpec,
        executor_id: str,
        data_root: str = ".",
        *,
        executor_index: int | None = None,
        trainers: int | None = None,
        task_runners: int | None = None,
        buffer_batches: int | None = None,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        kafka_bootstrap: str | None = None,
        heartbeat_s: float | None = None,
        slow_ms_per_batch: float = 0.0,
        poll_s: float = 0.05,
        serve: bool = True,
        shm: bool = True,
        fields: Sequence[str] | None = None,
    ):
        self.driver = driver
        # The canonical fields the trainers read (None: all); the others are never decoded.
        self.fields = check_fields(fields)
        self.job = job
        self.executor_id = executor_id
        self.context = SourceContext(data_root=data_root, kafka_bootstrap_servers=kafka_bootstrap)
        self.trainers = trainers or job.pools.training.replicas or 1
        self.index = executor_index if executor_index is not None else executor_index_from_id(executor_id)
        self.task_runners = task_runners or job.pools.data.task_runners
        self.lease_s = job.data.lease.total_seconds()
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else max(0.05, self.lease_s / 4)
        self.poll_s = poll_s
        self.shuffles = {s.name: make_shuffle(s.shuffle, self.index, self.trainers) for s in job.dataset.streams}
        # data.deterministic with several trainers: each batch's trainer is fixed (shuffle.ordered_trainer)
        self.ordered = job.data.deterministic and self.trainers > 1
        targets = range(self.trainers) if self.ordered else (t for s in self.shuffles.values() for t in s.targets())
        self.targets = sorted(set(targets))
        self.buffers: TrainerBuffers[Batch] = TrainerBuffers(self.trainers, buffer_batches or job.data.buffer_batches)
        self.server = (
            DatasetServer(
                self,
                host=host,
                port=port,
                token=token,
                slow_ms_per_batch=slow_ms_per_batch,
                advertise=advertise,
                shm=shm,
            )
            if serve
            else None
        )
        self.location = self.server.location if self.server else f"inproc://{executor_id}"
        self._lock = threading.Condition()
        self._tasks: dict[str, _TaskRun] = {}
        self._abandoned: set[str] = set()  # tasks stopped mid-read, to release at close
        self._schema: pa.Schema | None = None
        self._stop = threading.Event()  # lease no more tasks
        self._no_more_work = threading.Event()  # all runners exited: streams end when drained
        self._hb_stop = threading.Event()
        self.driver_done = False
        self.fatal: str | None = None
        self.counters = _Counters()
        self._meter = RateMeter()
        self._last_hb_ok = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._local = threading.local()
        self._started = False
        # Tasks served completely while a runner reads another: their completion rides with that runner's
        # next lease (one round trip per task); (queued at, completion). _reading: runners inside a task.
        self._completions: list[tuple[float, Completion]] = []
        self._reading = 0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> DataExecutor:
        """Heartbeat once (registers the address), then start heartbeats and task runners."""
        if self._started:
            return self
        self._started = True
        self._heartbeat_once()
        hb = threading.Thread(target=self._heartbeat_loop, name=f"{self.executor_id}-heartbeat", daemon=True)
        hb.start()
        runners = [
            threading.Thread(target=self._runner, name=f"{self.executor_id}-runner-{i}", daemon=True)
            for i in range(self.task_runners)
        ]
        for t in runners:
            t.start()
        threading.Thread(target=self._watch_runners, args=(runners,), daemon=True).start()
        self._threads = [hb, *runners]
        return self

    def _watch_runners(self, runners: list[threading.Thread]) -> None:
        for t in runners:
            t.join()
        self._no_more_work.set()
        self.buffers.wake()
        with self._lock:
            self._lock.notify_all()

    def stop(self) -> None:
        """Lease nothing more and abandon the tasks being read (released to the driver at
        :meth:`close`); already-buffered batches are still served until :meth:`close`."""
        self._stop.set()
        self.buffers.wake()

    def finished(self) -> bool:
        """No more work and every trainer buffer drained."""
        return self._no_more_work.is_set() and not any(self.buffers.fills())

    def drained(self, trainer: int) -> bool:
        """No more work and ``trainer``'s buffer empty: every batch for it has been taken."""
        return self._no_more_work.is_set() and not self.buffers.fills()[trainer]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`finished`; True if it is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.finished():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self, drain_s: float = 0.0, linger_s: float = 0.0) -> None:
        """Stop; serve what is buffered for up to ``drain_s``; let open streams end for up to
        ``linger_s``; then end every stream and shut the server down."""
        self.stop()
        if drain_s > 0:
            self.wait(drain_s)
        deadline = time.monotonic() + linger_s
        while self.server is not None and not self.server.idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.buffers.close()
        self._no_more_work.wait(max(1.0, self.heartbeat_s * 2))
        self._hb_stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._flush_completions()
        self._release_unfinished()
        if self.server is not None:
            self.server.shutdown()

    def _release_unfinished(self) -> None:
        """Hand the tasks this executor leased and will not finish back to the driver (a scale-in or
        shutdown then costs no lease timeout); best effort -- without it the leases expire."""
        with self._lock:
            unfinished = sorted({*self._abandoned, *(t for t, run in self._tasks.items() if not run.finished)})
            self._abandoned.clear()
        if not unfinished or self.driver_done:
            return
        try:
            released = self.driver.release(self.executor_id, unfinished)
        except Exception as exc:
            log.warning("%s: could not release %d unfinished tasks: %s", self.executor_id, len(unfinished), exc)
            return
        log.info("%s: released %d unfinished tasks", self.executor_id, len(released))

    def __enter__(self) -> DataExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- BatchFeed (dataset server)
    def wait_schema(self, timeout: float | None = None) -> pa.Schema | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._schema is None:
                if self._no_more_work.is_set() or self.buffers.closed:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                self._lock.wait(0.1)
            return self._schema

    def next_for(self, trainer: int, timeout: float | None = None) -> Batch | None:
        return self.buffers.get(trainer, finished=self._no_more_work.is_set, timeout=timeout)

    def take(self, trainer: int, timeout: float | None = None) -> Batch | None:
        """In-process consumption (no Flight): the next batch for ``trainer``, marked served."""
        batch = self.buffers.get(trainer, finished=self._no_more_work.is_set, timeout=timeout)
        if batch is not None:
            self.served(batch)
        return batch

    def served(self, batch: Batch) -> None:
        with self._lock:
            self.counters.rows_served += batch.rows
            run = self._tasks.get(batch.meta.task_id)
            if run is None:
                return
            run.outstanding -= 1
        self._maybe_complete(run)

    def unserved(self, batch: Batch, trainer: int) -> None:
        self.buffers.requeue(trainer, batch)

    # ----------------------------------------------------------------- task runners
    def _runner(self) -> None:
        backoff = self.poll_s
        try:
            while not self._stop.is_set():
                # No room, or another runner already waits for room (this executor has more work
                # than its trainers take): leave the next task to an executor that can serve it
                # sooner, instead of holding it leased (a slow executor would hoard tasks).
                if self.buffers.waiting or self.buffers.fill_ratio(self.targets) >= 1.0:
                    self._stop.wait(self.poll_s)
                    continue
                completed = self._take_completions()
                try:
                    leases = (
                        self.driver.lease(self.executor_id, 1, completed)
                        if completed
                        else self.driver.lease(self.executor_id, 1)
                    )
                except Exception as exc:  # driver briefly unreachable: retry
                    log.warning("%s: lease failed: %s", self.executor_id, exc)
                    self._requeue_completions(completed)
                    leases = []
                if not leases:
                    if self._driver_says_done():
                        break
                    self._stop.wait(backoff)
                    # Idle: back off, but not far. Every reader waits for every executor's streams
                    # to end, i.e. for the last idle runner to see the driver done (a 1 s cap put
                    # up to a second of dead time at the end of each job).
                    backoff = min(backoff * 2, 0.25)
                    continue
                backoff = self.poll_s
                for lease in leases:
                    with self._lock:
                        self._reading += 1
                    try:
                        self._run(lease)
                    finally:
                        with self._lock:
                            self._reading -= 1
        finally:
            for adapter in getattr(self._local, "adapters", {}).values():
                adapter.close()

    def _driver_says_done(self) -> bool:
        if self.driver_done:
            return True
        try:
            status = self.driver.status()
        except Exception:
            return False
        if status.get("done") or status.get("failed"):
            self.driver_done = True
            self._stop.set()
        return self.driver_done

    def _adapter(self, source: str) -> SourceAdapter:
        """This thread's adapter of ``source`` for read tasks: projected to :attr:`fields`, and
        without the constant columns (a :class:`Batch` carries them in its metadata)."""
        return self._thread_adapter(source, projected=True)

    def _full_adapter(self, source: str) -> SourceAdapter:
        """For join tasks: the join reads key and ``ts`` whatever the trainers read."""
        return self._thread_adapter(source, projected=False)

    def _thread_adapter(self, source: str, projected: bool) -> SourceAdapter:
        adapters: dict[tuple[str, bool], SourceAdapter] = self._local.__dict__.setdefault("adapters", {})
        key = (source, projected)
        if key not in adapters:
            adapter = make_adapter(self.job.dataset.source(source), self.context)
            if projected:
                adapter = adapter.project(self.fields, constants=False)
                # Served batches keep the dense matrix as its columns (canonical.split_dense_schema): no
                # interleaving pass here; in this process (serve=False) the reader would interleave it.
                adapter.normalize.split_dense = self.server is not None
            adapters[key] = adapter
        return adapters[key]

    def _project(self, columns: pa.RecordBatch) -> pa.RecordBatch:
        """A join task's output trimmed to :attr:`fields` (read tasks are read that way)."""
        if self.fields is None:
            return columns
        drop = [name for name in OPTIONAL_FIELDS if name not in self.fields]
        keep = [i for i, name in enumerate(columns.schema.names) if name not in drop]
        return columns if len(keep) == columns.num_columns else columns.select(keep)

    def _conform(self, wire: pa.RecordBatch, task: DataTask) -> pa.RecordBatch:
        with self._lock:  # the first batch fixes the schema of this executor's Flight streams
            if self._schema is None:
                self._schema = wire.schema
                self._lock.notify_all()
            schema = self._schema
        return conform(wire, schema, f"task {task.task_id} ({task.read.uri})")

    def _run(self, lease: Lease) -> None:
        task = lease.task
        run = _TaskRun(lease)
        with self._lock:
            self._tasks[task.task_id] = run
        abort = lambda: run.cancelled or self._stop.is_set()  # noqa: E731
        try:
            shuffle = self.shuffles[task.stream]
            skip = set(lease.claimed_rows)
            first = 0
            adapter_for = self._adapter if task.join is None else self._full_adapter
            adapter_for(task.read.source).normalize.take()  # counts of an abandoned read are not this task's
            for arrow_batch in task_batches(task, adapter_for):
                if abort():
                    return self._abandon(run)
                if self._completions:
                    self._flush_completions(older_than=_COMPLETION_DELAY_S)
                n = arrow_batch.num_rows
                if n == 0:
                    continue
                batch_id = BatchId(task.task_id, first, n)
                first += n
                run.batches += 1
                if batch_id.first_row in skip:
                    continue
                meta = BatchMeta(batch_id.task_id, first - n, n, task.stream, task.kind, task.read.source)
                if task.join is None:  # already without the constant columns (see _adapter)
                    columns = arrow_batch
                else:
                    columns = self._project(Batch.from_arrow(arrow_batch, kind=task.kind).columns)
                    columns = split_dense(columns) if self.server is not None else columns
                batch = Batch(self._conform(columns, task), meta)
                with self._lock:
                    run.outstanding += 1
                chosen: Shuffle = shuffle
                if self.ordered:
                    chosen = FixedShuffle(ordered_trainer(lease.place, run.batches - 1, self.trainers), self.trainers)
                if self.buffers.put(batch, chosen, abort=abort) is None:
                    return self._abandon(run)
                with self._lock:
                    self.counters.rows_read += n
                    self.counters.batches_read += 1
            run.rows = first
            adapter = adapter_for(task.read.source)
            run.quality_columns = adapter.normalize.broken_columns()
            run.quality = adapter.normalize.take()
            if task.read.members:
                places = adapter.last_read_stats.get("quality_places") or {}
                run.places = {uri: dict(counts) for uri, counts in places.items() if counts}
            with self._lock:
                run.read_done = True
        except Exception as exc:  # every read error fails the task, with its URI
            if run.cancelled:
                return None
            self._fail(run, exc)
            return None
        self._maybe_complete(run)
        return None

    def _abandon(self, run: _TaskRun) -> None:
        """Stopped or cancelled mid-read: neither complete nor fail (released at :meth:`close`)."""
        with self._lock:
            run.finished = True
            self._tasks.pop(run.lease.task.task_id, None)
            if not run.cancelled:
                self._abandoned.add(run.lease.task.task_id)
        task_id = run.lease.task.task_id
        self.buffers.purge(lambda b: b.meta.task_id == task_id)

    def _fail(self, run: _TaskRun, exc: BaseException) -> None:
        task = run.lease.task
        message = str(exc)
        failure = pack_failure(exc)  # one file of a pack (named in the message): it may be given up alone
        if failure is None and task.read.uri not in message:
            message = f"{task.read.uri}: {message}"
        message = f"{type(exc).__name__}: {message}"
        self._abandon(run)
        with self._lock:
            self.counters.tasks_failed += 1
            self.counters.errors = [*self.counters.errors[-99:], f"{task.task_id}: {message}"]  # the last 100
        log.warning("%s: task %s failed: %s", self.executor_id, task.task_id, message)
        try:
            if failure is not None:
                member = MemberFailure(failure.member, not is_permanent(exc), failure.served_members)
                self.driver.fail(self.executor_id, task.task_id, message, member=member)
            elif is_permanent(exc):  # schema, type or data-quality `fail`: a retry would fail the same way
                self.driver.fail(self.executor_id, task.task_id, message, retryable=False)
            else:
                self.driver.fail(self.executor_id, task.task_id, message)
        except Exception as rpc_exc:
            log.warning("%s: could not report failure of %s: %s", self.executor_id, task.task_id, rpc_exc)

    def _maybe_complete(self, run: _TaskRun) -> None:
        with self._lock:
            if run.finished or run.cancelled or not run.read_done or run.outstanding > 0:
                return
            run.finished = True
            self._tasks.pop(run.lease.task.task_id, None)
            self.counters.tasks_completed += 1
        done = Completion(
            run.lease.task.task_id,
            run.rows,
            run.batches,
            run.quality or None,
            run.places or None,
            run.quality_columns or None,
        )
        with self._lock:
            if self._reading and not self._stop.is_set():  # a runner leases again soon: it takes this along
                self._completions.append((time.monotonic(), done))
                return
        self._complete(done)

    def _complete(self, done: Completion) -> None:
        try:
            # only what the task has: a driver implementing an older DriverAPI takes the positional four
            extra: dict[str, Any] = {
                "quality": done.quality,
                "places": done.places,
                "quality_columns": done.quality_columns,
            }
            self.driver.complete(
                self.executor_id, done.task_id, done.rows, done.batches, **{k: v for k, v in extra.items() if v}
            )
        except Exception as exc:  # the lease will expire; the re-run's batches are deduplicated by claims
            log.warning("%s: could not complete %s: %s", self.executor_id, done.task_id, exc)

    def _take_completions(self) -> list[Completion]:
        with self._lock:
            taken, self._completions = self._completions, []
        return [done for _, done in taken]

    def _requeue_completions(self, completed: list[Completion]) -> None:
        if completed:
            with self._lock:
                self._completions[:0] = [(time.monotonic(), done) for done in completed]

    def _flush_completions(self, older_than: float = 0.0) -> None:
        """Send the queued completions now (when the oldest waited ``older_than`` seconds): a runner
        that reads on, or waits for room, does not lease soon."""
        with self._lock:
            if not self._completions or time.monotonic() - self._completions[0][0] < older_than:
                return
        for done in self._take_completions():
            self._complete(done)

    def cancel(self, task_ids: list[str]) -> None:
        """The driver no longer considers these tasks ours: stop them, drop their buffered batches."""
        for task_id in task_ids:
            with self._lock:
                run = self._tasks.pop(task_id, None)
                if run is None:
                    continue
                run.cancelled = True
                run.finished = True
            self.buffers.purge(lambda it, t=task_id: it.meta.task_id == t)  # type: ignore[misc]
        self.buffers.wake()

    # ----------------------------------------------------------------- heartbeats and metrics
    def metrics(self) -> dict[str, float]:
        """rows_per_s / batches_per_s since the last call, buffer_fill, cpu, rss_bytes, tasks_running,
        buffered_rows.<kind> (rows of each kind in the serving buffers: the mixture prioritisation's q_i)."""
        with self._lock:
            rows, batches, running = self.counters.rows_read, self.counters.batches_read, len(self._tasks)
        buffered = self.buffers.totals(lambda b: b.meta.kind, lambda b: b.rows)
        return {
            **self._meter.sample(rows, batches),
            "buffer_fill": self.buffers.fill_ratio(self.targets),
            "tasks_running": float(running),
            **{f"{BUFFERED_ROWS}{kind}": buffered.get(kind, 0.0) for kind in ("batch", "stream")},
        }

    def report(self) -> ExecutorReport:
        with self._lock:
            running = list(self._tasks)
        return ExecutorReport(self.executor_id, self.location, running=running, metrics=self.metrics())

    def _heartbeat_once(self) -> dict[str, Any] | None:
        try:
            answer = self.driver.heartbeat(self.report()) or {}
        except Exception as exc:
            log.warning("%s: heartbeat failed: %s", self.executor_id, exc)
            if time.monotonic() - self._last_hb_ok > 2 * self.lease_s:
                self.fatal = f"driver unreachable for {2 * self.lease_s:.0f}s: {exc}"
                self.stop()
            return None
        self._last_hb_ok = time.monotonic()
        if answer.get("cancel"):
            self.cancel(list(answer["cancel"]))
        if answer.get("done") or answer.get("failed"):
            self.driver_done = True
            self.stop()
        return answer

    def _heartbeat_loop(self) -> None:
        while not self._hb_stop.wait(self.heartbeat_s):
            self._flush_completions(older_than=_COMPLETION_DELAY_S)  # a runner blocked on a full buffer
            self._heartbeat_once()
