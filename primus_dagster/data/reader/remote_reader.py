"""The trainer-side remote reader: Flight streams from data executors into batch / stream queues.

A :class:`RemoteReader` runs one thread per data executor, each doing ``DoGet`` with ticket
``{"trainer": i}`` and reading that executor's batches for trainer ``i``. Every received batch is
``claim``-ed at the driver first and dropped when the claim is refused (a duplicate served after
an executor died), then queued as a :class:`~primus_dagster.data.batch.Batch` by its kind
(``batch`` or ``stream``); its tensors are views over the received Arrow buffers. :meth:`RemoteReader.next_batch` pops the queue a pluggable ``choose_queue`` picks
(the mixture prioritisation plugs in there). The reader ends when every executor stream ended
(and, when executors are discovered through the driver, the driver says the run's data is done: every
batch claimed) and its queues are empty; once the data is done, the streams of executors the driver no
longer hears from (frozen ones) are cancelled rather than waited for.

Executors in this very process (``feeds``: :class:`~primus_dagster.data.executor.DataExecutor`
objects started with ``serve=False``, located at ``inproc://<id>``) are read by calling them: no
Flight, no shared memory, no copy -- the reader's tensors are views over the executor's own Arrow
buffers (:class:`~primus_dagster.data.InTrainerDataPlane`).

An executor on this host (loopback address) that offers it serves through shared memory: the
stream then carries only descriptors and the batch is read zero-copy from the executor's slot,
which stays reserved while the trainer holds the batch (``docs/shared_memory.md``);
``shm=False`` or ``$PRIMUS_SHM=0`` keeps every batch in the Flight stream.

Queues are bounded (``prefetch`` batches each): a full queue stops its fetchers, which stops the
Flight stream, which fills the executor's buffer, which blocks its task runners. Because one
executor stream carries both kinds, asking only for ``kind="stream"`` while the ``batch`` queue is
full can stall that stream: consumers that filter by kind must drain the other queue too.

``deterministic=True`` (``data.deterministic``) releases the batches in ONE order fixed by the plan
instead of as they arrive: per kind, task by task in the driver's task order, each task's batches by
``first_row`` (:class:`KindOrder`), whatever executor reads which task when. The reader keeps what arrived
early in a reorder buffer; it tells the driver its place in the order (``task_order``), and a
deterministic driver leases only ``order_window`` tasks ahead of it, which bounds that buffer (fetchers
never block on it). ``choose_queue`` then sees ``QueueStat.size`` 1 for every kind not found exhausted
(0 after), is called exactly once per batch, and the reader waits for the chosen kind's next batch in
order (when that kind has none left, it takes the next kind). Each wait is bounded: no batch for
``order_timeout_s`` raises :class:`TimeoutError` naming the task it waits for.

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

#: Batches each queue holds ahead of the trainer (``prefetch``), what every trainer of a job reads with.
DEFAULT_PREFETCH = 4


# -- the reorder buffer of a deterministic reader -------------------------------------------------------
# Why releasing the smallest held ``first_row`` of the current task is safe: an executor serves a task's
# batches in ``first_row`` order, a retry skips the batches already claimed, and so the *first* claims of a
# task's batches come in ``first_row`` order however many copies run. A held batch whose task has no claim
# in flight at this reader therefore has every smaller batch of the task (of this reader) already held or
# released.


class KindOrder:
    """The reorder buffer of one kind (``batch`` or ``stream``) of a deterministic reader: its place in
    the plan's order, the tasks ahead as the driver's ``task_order`` last described them, and the
    batches that arrived early, keyed by task and ``first_row``. Pure bookkeeping, under the reader's
    lock.

    Example::

        order = KindOrder("batch")
        order.update(0, driver.task_order("trainer-0", "batch", 0, 64))
        order.add(batch)                       # arrived and claimed
        next_one = order.take(claiming={})     # the next batch in the plan's order, or None (wait)
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.pos = 0  # place (in the kind's task order) of the task being released
        self.total: int | None = None  # the kind's tasks (None: the driver was not asked yet)
        self.planned = False  # the driver's task set is final
        self.ids: dict[int, str] = {}  # place -> task id, from pos on
        self.sealed: set[int] = set()  # places whose task no batch will be claimed of any more
        self.failed: set[int] = set()  # places whose task failed
        self.held: dict[str, dict[int, Batch]] = {}  # task id -> first_row -> batch
        self.late: deque[Batch] = deque()  # batches of a failed task this order already passed
        self.passed_failed: set[str] = set()
        self.batches = 0  # held + late
        self.rows = 0
        self.moved = False  # pos advanced since the driver was last told

    @property
    def exhausted(self) -> bool:
        """Every task of the kind passed, nothing left to release."""
        return self.planned and self.total is not None and self.pos >= self.total and not self.late

    @property
    def current(self) -> str | None:
        """The id of the task being released (None: not known yet, or none left)."""
        return self.ids.get(self.pos)

    def add(self, batch: Batch) -> None:
        """A claimed batch of this kind arrived."""
        meta = batch.meta
        self.batches += 1
        self.rows += batch.rows
        if meta.task_id in self.passed_failed:
            log.warning(
                "deterministic order: batch %s of failed task %s arrived after its place; released out of order",
                meta.first_row,
                meta.task_id,
            )
            self.late.append(batch)
            return
        self.held.setdefault(meta.task_id, {})[meta.first_row] = batch

    def update(self, start: int, reply: Mapping[str, Any]) -> None:
        """Apply a ``task_order`` reply for places ``start`` on."""
        self.total = int(reply["total"])
        self.planned = bool(reply["planned"])
        for offset, (task_id, sealed, failed) in enumerate(reply["tasks"]):
            place = start + offset
            if place < self.pos:
                continue
            self.ids[place] = str(task_id)
            if sealed:
                self.sealed.add(place)
            if failed:
                self.failed.add(place)
        if self.planned and self.pos >= self.total and any(self.held.values()):
            self._release_leftovers()

    def take(self, claiming: Mapping[str, int]) -> Batch | None:
        """The next batch in the plan's order, or None while it is not known yet (``claiming``: claims in
        flight per task id at the reader)."""
        while True:
            if self.late:
                return self._out(self.late.popleft())
            task_id = self.current
            if task_id is None or claiming.get(task_id, 0) > 0:
                return None
            held = self.held.get(task_id)
            if held:
                first_row = min(held)
                batch = held.pop(first_row)
                if not held:
                    del self.held[task_id]
                return self._out(batch)
            if self.pos not in self.sealed:
                return None
            self._advance(task_id)

    def _advance(self, task_id: str) -> None:
        if self.pos in self.failed:
            self.passed_failed.add(task_id)
        self.held.pop(task_id, None)
        del self.ids[self.pos]
        self.sealed.discard(self.pos)
        self.failed.discard(self.pos)
        self.pos += 1
        self.moved = True
        if self.planned and self.total is not None and self.pos >= self.total and any(self.held.values()):
            self._release_leftovers()

    def _release_leftovers(self) -> None:
        """Batches still held once every task passed (a claim the order could not place): released, not lost."""
        leftovers = sorted(
            (batch for rows in self.held.values() for batch in rows.values()),
            key=lambda b: (b.meta.task_id, b.meta.first_row),
        )
        log.warning("deterministic order: %d %s batch(es) held past the last task; released", len(leftovers), self.kind)
        self.held.clear()
        self.late.extend(leftovers)

    def _out(self, batch: Batch) -> Batch:
        self.batches -= 1
        self.rows -= batch.rows
        return batch

    def describe(self) -> str:
        """Where the order waits, for messages."""
        task_id = self.current
        total = "?" if self.total is None else str(self.total)
        if task_id is None:
            return f"{self.kind} task at place {self.pos} of {total} (not described by the driver yet)"
        state = "sealed" if self.pos in self.sealed else "not sealed"
        return (
            f"{self.kind} task {task_id} (place {self.pos} of {total}, {state}, "
            f"{len(self.held)} later task(s) with {self.batches} batch(es) held)"
        )


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
    by location (``inproc://<id>``), read by calling them instead of over Flight. ``deterministic``:
    release the batches in the plan's order (module docstring; ``order_timeout_s`` bounds each wait for
    the next one, ``order_limit`` is how many tasks ahead one ``task_order`` call describes).
    """

    def __init__(
        self,
        driver: DriverAPI,
        trainer_id: int,
        executors: Sequence[str] | Callable[[], Iterable[str]] | None = None,
        *,
        token: str | None = None,
        queues: Sequence[str] = ("batch", "stream"),
        prefetch: int = DEFAULT_PREFETCH,
        choose_queue: ChooseQueue | None = None,
        refresh_s: float = 0.5,
        max_retries: int = 5,
        shm: bool | None = None,
        feeds: Mapping[str, InProcessFeed] | None = None,
        deterministic: bool = False,
        order_timeout_s: float = 300.0,
        order_limit: int = 64,
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
        # deterministic: the plan's order per kind, claims in flight per task, the kind picked for the
        # next batch (kept across a timeout), the kinds found exhausted when picked
        self.deterministic = deterministic
        self.order_timeout_s = order_timeout_s
        self.order_limit = max(1, order_limit)
        self._orders = {q: KindOrder(q) for q in queues} if deterministic else {}
        self._claiming: dict[str, int] = {}
        self._pick: str | None = None
        self._dead: set[str] = set()
        self._order_due = False
        self._data_failed = False
        self._warned_window = False
        self._order_thread: threading.Thread | None = None
        if deterministic:
            self._refresh_order()  # the driver knows this reader's place before any batch is fetched
            self._order_thread = threading.Thread(
                target=self._order_loop, name=f"reader-{trainer_id}-order", daemon=True
            )
            self._order_thread.start()
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

    def _listing(self) -> set[str] | None:
        """The executors' current locations (None when listing failed)."""
        try:
            return {loc for loc in self._list() if loc}
        except Exception as exc:
            log.warning("reader %s: cannot list executors: %s", self.trainer_id, exc)
            return None

    def _discover(self) -> set[str] | None:
        """Start fetchers for new locations; the current listing (None when listing failed)."""
        if (current := self._listing()) is None:
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
                if status.get("failed"):
                    self._data_failed = True
            except Exception:
                done = False
            listed = self._discover()
            if listed is not None:
                self._listed = listed
            if done:  # every batch was claimed already: no new executor matters
                with self._cond:
                    self._discovery_done = True
                    self._cond.notify_all()
                self._end_silent_streams()
                return
            with self._cond:
                # Woken early when a fetcher's stream ends: the data may have ended with it, and the
                # reader (the trainer's phase) ends only once the driver says so.
                self._cond.wait_for(lambda: self._closing or self._ended_unseen, self.refresh_s)
                self._ended_unseen = False

    def _end_silent_streams(self) -> None:
        """The data is done (every batch claimed): cancel the streams of executors the driver no longer
        hears from (frozen, e.g. SIGSTOPped: their stream would never end), until every fetcher ended.
        Live executors end their streams themselves; a silent one drops out of the listing after a lease."""
        while not self._closing:
            with self._cond:
                if self._alive == 0:
                    return
            listed = self._listing()
            for location, stream in list(self._streams.items()):
                if listed is not None and location not in listed:
                    log.warning(
                        "reader %s: executor %s is silent and the data is done; ending its stream",
                        self.trainer_id,
                        location,
                    )
                    with contextlib.suppress(Exception):
                        stream.cancel()
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._alive == 0, self.refresh_s)

    def _retry(self, location: str, attempts: int) -> bool:
        """Reconnect to a failed stream? Static list: up to ``max_retries``; discovered: while the
        driver still lists the executor and the run's data is not done (then every batch was claimed)."""
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
        if self.deterministic:
            self._accept_in_order(batch)
            return
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

    def _accept_in_order(self, batch: Batch) -> None:
        """Claim ``batch`` and hold it in its kind's reorder buffer. The claim in flight is counted, so
        the order never passes a batch that was claimed but is not held yet."""
        meta = batch.meta
        with self._cond:
            self._claiming[meta.task_id] = self._claiming.get(meta.task_id, 0) + 1
        try:
            first = self.driver.claim(self.claimant, meta.batch_id)
            if first:
                batch.tensors  # noqa: B018 - converted here, in the fetcher thread, not on the trainer's
        finally:
            with self._cond:
                left = self._claiming[meta.task_id] - 1
                if left:
                    self._claiming[meta.task_id] = left
                else:
                    del self._claiming[meta.task_id]
                self._cond.notify_all()
        with self._cond:
            if not first:
                self.stats["dropped"] += 1
                return
            self._orders[meta.kind].add(batch)
            self._received[meta.kind] += 1
            self._rows[meta.kind] += batch.rows
            self._cond.notify_all()

    # ----------------------------------------------------------------- the plan's order (deterministic)
    def _refresh_order(self) -> None:
        """Tell the driver this reader's place in each kind's order; learn the tasks ahead."""
        with self._cond:
            asks = [(name, order.pos) for name, order in self._orders.items()]
            for order in self._orders.values():
                order.moved = False
        replies = [
            (name, pos, self.driver.task_order(self.claimant, name, pos, self.order_limit)) for name, pos in asks
        ]
        with self._cond:
            for name, pos, reply in replies:
                self._orders[name].update(pos, reply)
                if reply.get("failed"):
                    self._data_failed = True
                if not reply.get("window") and not self._warned_window:
                    self._warned_window = True
                    log.warning(
                        "reader %s: deterministic order on a driver that is not deterministic: it leases "
                        "without a window, so the reorder buffer is not bounded",
                        self.trainer_id,
                    )
            self._cond.notify_all()

    def _order_loop(self) -> None:
        """Ask the driver about the order when the consumer waits for it or moved on (at least every 0.25 s)."""
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(
                        lambda: self._closing or self._order_due or any(o.moved for o in self._orders.values()),
                        0.25,
                    )
                    if self._closing:
                        return
                    self._order_due = False
                self._refresh_order()
                time.sleep(0.002)  # at most ~500 calls a second while the consumer waits
        except BaseException as exc:
            self._fail(exc)

    def _take_in_order(self, kind: str | None) -> tuple[Batch | None, bool]:
        """The next batch in the plan's order (of ``kind``, or of the kind ``choose_queue`` picks once
        per batch) and whether the data ended; under the lock."""
        if kind is not None:
            order = self._orders[kind]
            batch = order.take(self._claiming)
            return batch, batch is None and order.exhausted
        if self._pick is None:
            live = [name for name in self._orders if name not in self._dead]
            if not live:
                return None, True
            stats = {
                name: QueueStat(name, int(name not in self._dead), 1, self._received[name], 0.0, 0)
                for name in self._orders
            }
            picked = self.choose_queue(stats)
            self._pick = picked if picked in live else live[0]
        while True:
            order = self._orders[self._pick]
            batch = order.take(self._claiming)
            if batch is not None:
                self._pick = None
                return batch, False
            if not order.exhausted:
                return None, False  # wait for the picked kind's next batch
            self._dead.add(self._pick)  # no batch of it left: the next kind (found in the same place every run)
            live = [name for name in self._orders if name not in self._dead]
            if not live:
                self._pick = None
                return None, True
            self._pick = live[0]

    def _next_in_order(self, kind: str | None, timeout: float | None) -> Batch | None:
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        stall = started + self.order_timeout_s
        with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError(f"reader for trainer {self.trainer_id} failed: {self._error}") from self._error
                if self._closing or (self._data_failed and self._alive == 0):
                    return None
                batch, ended = self._take_in_order(kind)
                if batch is not None:
                    name = batch.meta.kind
                    self._rows[name] -= batch.rows
                    self._consumed.append(batch.batch_id)
                    self.stats["yielded"] += 1
                    self.stats["rows"] += batch.rows
                    return batch
                if ended:
                    return None
                self._order_due = True
                self._cond.notify_all()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise TimeoutError(f"no batch for trainer {self.trainer_id} within {timeout}s")
                if now >= stall:
                    waiting = self._orders[kind or self._pick or next(iter(self._orders))]
                    raise TimeoutError(
                        f"reader for trainer {self.trainer_id} (deterministic order): no batch for "
                        f"{self.order_timeout_s:g}s; it waits for {waiting.describe()}, whose batches did not "
                        f"arrive ({self._alive} executor stream(s) open)"
                    )
                self._cond.wait(min(0.1, stall - now, *(() if deadline is None else (deadline - now,))))

    def order_status(self) -> dict[str, dict[str, Any]]:
        """Deterministic reader: per kind, ``{"place", "total", "task", "held_tasks", "held_batches"}`` --
        its place in the plan's order, the task there, and how many tasks (that one included) and batches
        its reorder buffer spans; ``{}`` for a plain reader."""
        with self._cond:
            return {
                name: {
                    "place": order.pos,
                    "total": order.total,
                    "task": order.current,
                    "held_tasks": len({*order.held, *([order.current] if order.current else [])}),
                    "held_batches": order.batches,
                }
                for name, order in self._orders.items()
            }

    # ----------------------------------------------------------------- consumer side
    def queue_stats(self) -> dict[str, QueueStat]:
        with self._cond:
            return self._stats_locked()

    def _stats_locked(self) -> dict[str, QueueStat]:
        now = time.monotonic()
        if self.deterministic:  # what the reorder buffers hold
            return {
                name: QueueStat(name, order.batches, self.prefetch, self._received[name], 0.0, order.rows)
                for name, order in self._orders.items()
            }
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
        if self.deterministic:
            return self._next_in_order(kind, timeout)
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
        helpers = [t for t in (self._refresher, self._order_thread) if t is not None]
        for thread in [*self._fetchers.values(), *helpers]:
            thread.join(timeout=5)

    def __enter__(self) -> RemoteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
