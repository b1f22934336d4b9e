"""The trainer-side remote reader: Flight streams from data executors into batch / stream queues.

A :class:`RemoteReader` runs one thread per data executor, each doing ``DoGet`` with ticket
``{"trainer": i}`` and reading that executor's batches for trainer ``i``. Every received batch is
``claim``-ed at the driver first and dropped when the claim is refused (a duplicate served after
an executor died), then queued as a :class:`~primus_dagster.data.batch.Batch` by its kind
(``batch`` or ``stream``); its tensors are views over the received Arrow buffers. :meth:`RemoteReader.next_batch` pops the queue a pluggable ``choose_queue`` picks
(the mixture prioritisation plugs in there). The reader ends when every executor stream ended
(and, when executors are discovered through the driver, the driver says the run's tasks are done) and its
queues are empty.

Executors in this very process (``feeds``: :class:`~primus_dagster.data.executor.DataExecutor`
objects started with ``serve=False``, located at ``inproc://<id>``) are read by calling them: no
Flight, no shared memory, no copy -- the reader's tensors are views over the executor's own Arrow
buffers (``DirectDataPlane(executors_in_process=True)``).

An executor on this host (loopback address) that offers it serves through shared memory: the
stream then carries only descriptors and the batch is read zero-copy from the executor's slot,
which stays reserved while the trainer holds the batch (``docs/shared_memory.md``);
``shm=False`` or ``$PRIMUS_SHM=0`` keeps every batch in the Flight stream.

Queues are bounded (``prefetch`` batches each): a full queue stops its fetchers, which stops the
Flight stream, which fills the executor's buffer, which blocks its task runners. Because one
executor stream carries both kinds, asking only for ``kind="stream"`` while the ``batch`` queue is
full can stall that stream: consumers that filter by kind must drain the other queue too.

Example::

    reader = RemoteReader(driver, trainer_id=0, token="s3cret")     # executors from driver.executors()
    for batch in reader:                                            # Batch, until the data ends
        loss = model(batch.dense, batch.sparse, batch.label)
        if step % 500 == 0:
            snapshot = reader.barrier(step // 500)
    reader.close()
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as fl

from primus_dagster.data.batch import Batch, BatchMeta
from primus_dagster.data.driver.api import DriverAPI
from primus_dagster.data.executor.dataset_server import BatchFeed
from primus_dagster.data.flight_auth import bearer_options
from primus_dagster.data.flight_protocol import encode_ticket, split_meta
from primus_dagster.data.reader.queue_policy import ChooseQueue, QueueStat, batch_first
from primus_dagster.data.shm.slot_reader import ShmClient, ShmError, connect_shm
from primus_dagster.data.shm.slots import shm_enabled
from primus_dagster.data.tasks import BatchId

log = logging.getLogger(__name__)


class InProcessFeed(BatchFeed, Protocol):
    """An executor in the reader's process (a :class:`~primus_dagster.data.executor.DataExecutor`)."""

    def drained(self, trainer: int) -> bool:
        """No more work, and nothing left buffered for ``trainer``: its batches have all been taken."""


class RemoteReader:
    """Reads trainer ``trainer_id``'s batches from every data executor (see module docstring).

    ``executors``: a list of Flight locations, a callable returning the current ones, or None
    (then the addresses in ``driver.executors()``, refreshed every ``refresh_s``). ``shm``: read the
    batches of executors on this host through shared memory when they offer it (default: unless
    ``$PRIMUS_SHM=0``; see ``primus_dagster.data.shm.slots``). ``feeds``: executors in this process,
    by location (``inproc://<id>``), read by calling them instead of over Flight.
    """

    def __init__(
        self,
        driver: DriverAPI,
        trainer_id: int,
        executors: Sequence[str] | Callable[[], Iterable[str]] | None = None,
        *,
        token: str | None = None,
        queues: Sequence[str] = ("batch", "stream"),
        prefetch: int = 4,
        choose_queue: ChooseQueue | None = None,
        refresh_s: float = 0.5,
        max_retries: int = 5,
        shm: bool | None = None,
        feeds: Mapping[str, InProcessFeed] | None = None,
    ):
        self.driver = driver
        self._feeds = dict(feeds or {})
        self.trainer_id = trainer_id
        self.claimant = f"trainer-{trainer_id}"  # the trainer id the driver sees (claims, barriers)
        self.token = token
        self.prefetch = max(1, prefetch)
        self.choose_queue = choose_queue or batch_first
        self.refresh_s = refresh_s
        self.max_retries = max_retries
        self.shm = shm_enabled() if shm is None else shm
        self._static = executors is not None and not callable(executors)
        self._list: Callable[[], Iterable[str]]
        if executors is None:
            self._list = self._driver_executors
        elif callable(executors):
            self._list = executors
        else:
            fixed = list(executors)
            self._list = lambda: fixed
        self._cond = threading.Condition()
        self._queues: dict[str, deque[tuple[float, Batch]]] = {q: deque() for q in queues}
        self._received = dict.fromkeys(queues, 0)
        self._rows = dict.fromkeys(queues, 0)  # rows queued per kind (the serving buffers' state)
        self._fetchers: dict[str, threading.Thread] = {}
        self._streams: dict[str, Any] = {}
        self._alive = 0
        self._ended_unseen = False  # a fetcher ended since the refresher last looked
        self._closing = False
        self._error: BaseException | None = None
        self._consumed: list[BatchId] = []
        self.stats = {"received": 0, "dropped": 0, "yielded": 0, "rows": 0}
        # Set before the first fetcher starts: a fetcher that fails at once reads them.
        self._listed: set[str] = set()
        self._discovery_done = self._static
        self._listed = self._discover() or set()
        self._refresher = (
            None
            if self._static
            else threading.Thread(target=self._refresh_loop, name=f"reader-{trainer_id}-discovery", daemon=True)
        )
        if self._refresher is not None:
            self._refresher.start()

    # ----------------------------------------------------------------- discovery and fetchers
    def _driver_executors(self) -> list[str]:
        return [
            r.address
            for r in self.driver.executors().values()
            if r.address.startswith("grpc") or r.address in self._feeds
        ]

    def _discover(self) -> set[str] | None:
        """Start fetchers for new locations; the current listing (None when listing failed)."""
        try:
            current = {loc for loc in self._list() if loc}
        except Exception as exc:
            log.warning("reader %s: cannot list executors: %s", self.trainer_id, exc)
            return None
        with self._cond:
            for location in sorted(current - set(self._fetchers)):
                thread = threading.Thread(
                    target=self._fetch, args=(location,), daemon=True, name=f"reader-{self.trainer_id}-{location}"
                )
                self._fetchers[location] = thread
                self._alive += 1
                thread.start()
        return current

    def _refresh_loop(self) -> None:
        while not self._closing:
            try:
                status = self.driver.status()
                done = bool(status.get("done") or status.get("failed"))
            except Exception:
                done = False
            listed = self._discover()
            if listed is not None:
                self._listed = listed
            if done:  # every batch was handed to a stream already: no new executor matters
                with self._cond:
                    self._discovery_done = True
                    self._cond.notify_all()
                return
            with self._cond:
                # Woken early when a fetcher's stream ends: the data may have ended with it, and the
                # reader (the trainer's phase) ends only once the driver says so.
                self._cond.wait_for(lambda: self._closing or self._ended_unseen, self.refresh_s)
                self._ended_unseen = False

    def _retry(self, location: str, attempts: int) -> bool:
        """Reconnect to a failed stream? Static list: up to ``max_retries``; discovered: while the
        driver still lists the executor and the run's tasks are not done (then every batch was handed out)."""
        if self._static:
            return attempts <= self.max_retries
        return not self._discovery_done and location in self._listed

    def _fetch(self, location: str) -> None:
        if location in self._feeds:
            self._fetch_in_process(self._feeds[location])
            return
        attempts = 0
        try:
            while not self._closing:
                client = fl.connect(location)
                shm = None
                try:
                    options = bearer_options(self.token)
                    shm = connect_shm(location, client, options) if self.shm else None
                    stream = client.do_get(fl.Ticket(encode_ticket(self.trainer_id, shm=shm is not None)), options)
                    self._streams[location] = stream
                    while not self._closing:
                        try:
                            chunk = stream.read_chunk()
                        except StopIteration:
                            return  # the executor has no more work for us
                        attempts = 0
                        self._handle(chunk.data, chunk.app_metadata, shm)
                    return
                except fl.FlightUnauthenticatedError as exc:
                    self._fail(PermissionError(f"executor {location} rejected the token: {exc}"))
                    return
                except (
                    fl.FlightUnavailableError,
                    fl.FlightCancelledError,
                    fl.FlightTimedOutError,
                    fl.FlightInternalError,
                    ShmError,
                ) as exc:
                    if shm is not None:
                        shm.sweep()  # the executor died: remove the slot files nobody will map
                    attempts += 1
                    if self._closing or not self._retry(location, attempts):
                        log.info("reader %s: executor %s gone: %s", self.trainer_id, location, exc)
                        return
                    time.sleep(min(2.0, 0.1 * 2**attempts))
                finally:
                    self._streams.pop(location, None)
                    if shm is not None:
                        shm.close()
                    client.close()
        except BaseException as exc:
            self._fail(exc)
        finally:
            self._fetcher_ended()

    def _fetch_in_process(self, feed: InProcessFeed) -> None:
        """Take this trainer's batches from an executor in this process until it has no more."""
        try:
            while not self._closing:
                batch = feed.next_for(self.trainer_id, timeout=0.1)
                if batch is None:
                    if feed.drained(self.trainer_id):
                        return
                    continue
                try:
                    self._accept(batch)
                except BaseException:
                    feed.unserved(batch, self.trainer_id)
                    raise
                feed.served(batch)
        except BaseException as exc:
            self._fail(exc)
        finally:
            self._fetcher_ended()

    def _fetcher_ended(self) -> None:
        with self._cond:
            self._alive -= 1
            self._ended_unseen = True  # the refresher asks the driver at once whether the data ended
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def _handle(self, data: pa.RecordBatch | None, raw_meta: pa.Buffer | None, shm: ShmClient | None) -> None:
        if data is None:
            return
        meta, desc = split_meta(raw_meta)
        if desc is not None:
            if shm is None:
                raise ValueError(f"batch {meta.batch_id.key()} arrived in shared memory on a plain stream")
            data = shm.read(desc)
        self._accept(Batch(data, meta))  # source/kind stay in the metadata; rows checked there

    def _accept(self, batch: Batch) -> None:
        """Claim ``batch`` and queue it by kind (dropped when the claim is refused: a duplicate)."""
        meta: BatchMeta = batch.meta
        with self._cond:
            self.stats["received"] += 1
        if meta.kind not in self._queues:
            raise ValueError(
                f"batch {meta.batch_id.key()} has kind {meta.kind!r}; this reader has queues {list(self._queues)}"
            )
        if not self.driver.claim(self.claimant, meta.batch_id):
            with self._cond:
                self.stats["dropped"] += 1
            return
        batch.tensors  # noqa: B018 - converted here, in the fetcher thread, not on the trainer's
        item = (time.monotonic(), batch)
        with self._cond:
            queue = self._queues[meta.kind]
            while len(queue) >= self.prefetch and not self._closing:
                self._cond.wait(0.1)
            queue.append(item)
            self._received[meta.kind] += 1
            self._rows[meta.kind] += batch.rows
            self._cond.notify_all()

    # ----------------------------------------------------------------- consumer side
    def queue_stats(self) -> dict[str, QueueStat]:
        with self._cond:
            return self._stats_locked()

    def _stats_locked(self) -> dict[str, QueueStat]:
        now = time.monotonic()
        return {
            name: QueueStat(
                name, len(q), self.prefetch, self._received[name], now - q[0][0] if q else 0.0, self._rows[name]
            )
            for name, q in self._queues.items()
        }

    def next_batch(self, kind: str | None = None, timeout: float | None = None) -> Batch | None:
        """The next claimed batch (of ``kind``, or from the queue ``choose_queue`` picks); None once
        the data has ended; TimeoutError after ``timeout`` seconds without a batch."""
        if kind is not None and kind not in self._queues:
            raise ValueError(f"no queue {kind!r}; queues: {list(self._queues)}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError(f"reader for trainer {self.trainer_id} failed: {self._error}") from self._error
                name = kind
                if name is None and any(self._queues.values()):
                    stats = self._stats_locked()
                    name = self.choose_queue(stats)
                    if not stats.get(name, QueueStat(name, 0, 0, 0, 0.0)).size:
                        name = batch_first(stats)
                if name is not None and self._queues[name]:
                    _, batch = self._queues[name].popleft()
                    self._rows[name] -= batch.rows
                    self._consumed.append(batch.batch_id)
                    self.stats["yielded"] += 1
                    self.stats["rows"] += batch.rows
                    self._cond.notify_all()
                    return batch
                if self._closing or (
                    self._discovery_done and self._alive == 0 and (kind is None or not self._queues[kind])
                ):
                    return None
                wait = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError(f"no batch for trainer {self.trainer_id} within {timeout}s")
                self._cond.wait(wait)

    def __iter__(self) -> Iterator[Batch]:
        while (batch := self.next_batch()) is not None:
            yield batch

    def consumed(self) -> list[BatchId]:
        """BatchIds yielded since the last :meth:`barrier`."""
        with self._cond:
            return list(self._consumed)

    def barrier(self, barrier_id: int, wait_s: float = 0.0) -> dict[str, Any] | None:
        """Report the consumed batches at ``barrier_id``; the snapshot once every trainer reported
        (polled for up to ``wait_s`` seconds), else None."""
        with self._cond:
            consumed, self._consumed = self._consumed, []
        snapshot = self.driver.barrier(self.claimant, consumed, barrier_id)
        deadline = time.monotonic() + wait_s
        while snapshot is None and time.monotonic() < deadline:
            time.sleep(0.05)
            snapshot = self.driver.barrier(self.claimant, [], barrier_id)
        return snapshot

    def close(self) -> None:
        """Stop the fetchers (cancelling their streams) and wait for them."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for stream in list(self._streams.values()):
            with contextlib.suppress(Exception):
                stream.cancel()
        for thread in [*self._fetchers.values(), *([self._refresher] if self._refresher else [])]:
            thread.join(timeout=5)

    def __enter__(self) -> RemoteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
