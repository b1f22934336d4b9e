"""The dataset server: an Arrow Flight server in the data executor process.

``DoGet`` with ticket ``{"trainer": i}`` (JSON) streams trainer ``i``'s buffered batches, each
with its :class:`~primus_dagster.data.flight_protocol.BatchMeta` as Flight ``app_metadata``,
until the executor has no more work for that trainer (then the stream ends cleanly). With a
token, every call must carry ``authorization: Bearer <token>``.

A reader on the same host may ask for ``{"trainer": i, "shm": true}`` after ``DoAction("shm-info")``:
then the batches lie in shared-memory slots and the stream only carries their descriptors
(``docs/shared_memory.md``); a server started with ``shm=False`` (or ``$PRIMUS_SHM=0``) refuses ``shm-info``.

The server only talks to a :class:`BatchFeed` (the executor), so it holds no task logic.

Example::

    server = DatasetServer(executor, host="127.0.0.1", port=0, token="s3cret")
    print(server.location)            # grpc://127.0.0.1:PORT
    ...
    server.shutdown()
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Protocol

import pyarrow as pa
import pyarrow.flight as fl

from primus_dagster.data.batch import Batch
from primus_dagster.data.flight_auth import BearerTokenMiddlewareFactory
from primus_dagster.data.flight_protocol import parse_ticket, with_shm
from primus_dagster.data.shm.slots import SHM_ACTION, ShmDir, Slot, SlotPool, shm_enabled

log = logging.getLogger(__name__)

# Polling for the reader's receipts while no batch is waiting: from 2 ms, doubling to 20 ms.
_REAP_MIN_S, _REAP_MAX_S = 0.002, 0.02


class BatchFeed(Protocol):
    """What the dataset server needs from the executor."""

    trainers: int

    def wait_schema(self, timeout: float | None = None) -> pa.Schema | None:
        """The wire schema of this executor's batches; None when no batch will ever come."""

    def next_for(self, trainer: int, timeout: float | None = None) -> Batch | None:
        """Block for ``trainer``'s next batch; None once there is no more work for it (or after
        ``timeout`` seconds)."""

    def served(self, batch: Batch) -> None:
        """``batch`` was handed to the transport."""

    def unserved(self, batch: Batch, trainer: int) -> None:
        """``batch`` was taken but its stream broke before it was handed over: take it back."""


class DatasetServer(fl.FlightServerBase):
    """Flight server streaming a :class:`BatchFeed`'s per-trainer buffers (see module docstring)."""

    def __init__(
        self,
        feed: BatchFeed,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        slow_ms_per_batch: float = 0.0,
        advertise: str | None = None,
        shm: bool = True,
        shm_slots: int = 32,
        shm_inflight: int = 4,
    ):
        if token is None and host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("dataset server listens on %s without a token: anyone who reaches it can read batches", host)
        middleware = {"auth": BearerTokenMiddlewareFactory(token, "dataset server")} if token else None
        super().__init__(f"grpc://{host}:{port}", middleware=middleware)
        self.feed = feed
        self.slow_s = max(0.0, slow_ms_per_batch) / 1000.0
        # The slowdown models a slow executor, not a slow stream: its streams take turns sleeping,
        # so the executor serves at most one batch per ``slow_s`` whatever its number of streams.
        self._slow_lock = threading.Lock()
        self.location = f"grpc://{advertise or host}:{self.port}"
        self._lock = threading.Lock()
        self.active_streams = 0
        self.batches_sent = 0
        self.shm_batches_sent = 0
        self.shm_slots, self.shm_inflight = shm_slots, shm_inflight
        self._closing = threading.Event()
        self.shm: ShmDir | None = None
        if shm and shm_enabled():
            try:
                self.shm = ShmDir()
            except OSError as exc:
                log.warning("dataset server: no shared-memory path (%s); serving over Flight only", exc)

    def _stream(self, trainer: int) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        with self._lock:
            self.active_streams += 1
        pending = None
        try:
            while True:
                item = self.feed.next_for(trainer)
                if item is None:
                    return
                if self.slow_s:
                    with self._slow_lock:
                        time.sleep(self.slow_s)
                pending = item
                yield item.wire, item.meta.encode()
                # Flight asks for the next message only after writing this one.
                pending = None
                with self._lock:
                    self.batches_sent += 1
                self.feed.served(item)
        finally:
            if pending is not None:  # the client went away while this batch was in hand
                self.feed.unserved(pending, trainer)
            with self._lock:
                self.active_streams -= 1

    def _shm_stream(
        self, trainer: int, schema: pa.Schema, context: fl.ServerCallContext
    ) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """Like ``_stream``, with the batches in shared-memory slots (``docs/shared_memory.md``)."""
        assert self.shm is not None
        pool = SlotPool(self.shm, self.shm_slots, self.shm_inflight)
        empty = pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
        sent: deque[tuple[Slot, int, Batch]] = deque()  # in the reader's hands, maybe not received yet
        stop = lambda: self._closing.is_set() or context.is_cancelled()  # noqa: E731
        pending = None

        def reap() -> None:  # served: what the reader received, in order
            while sent and pool.received(sent[0][0], sent[0][1]):
                self.feed.served(sent.popleft()[2])

        with self._lock:
            self.active_streams += 1
        idle = _REAP_MIN_S
        try:
            while True:
                reap()
                if sent:  # keep reaping while waiting: a task completes once its batches are received
                    # The reader's receipts are words in shared memory (no wake-up): poll them, less
                    # often the longer nothing happens (a paused trainer costs ~1/_REAP_MAX_S wake-ups a second).
                    waited = time.monotonic()
                    item = self.feed.next_for(trainer, timeout=idle)
                    if item is None:
                        if stop():
                            return
                        rest = idle - (time.monotonic() - waited)
                        if rest > 0:  # next_for returns at once when the feed has ended
                            time.sleep(rest)
                        idle = min(idle * 2, _REAP_MAX_S)
                        continue
                    idle = _REAP_MIN_S
                else:
                    item = self.feed.next_for(trainer)
                    if item is None:
                        break
                pending = item
                if self.slow_s:
                    with self._slow_lock:
                        time.sleep(self.slow_s)
                if not pool.wait(lambda: pool.inflight() < pool.max_inflight, stop):
                    return
                put = pool.put(item.wire)
                if put is None:  # no free slot (the trainer holds them all) or no space: inline
                    yield item.wire, item.meta.encode()
                    pending = None
                    self.feed.served(item)
                else:
                    desc, slot = put
                    sent.append((slot, desc["seq"], item))
                    pending = None
                    yield empty, with_shm(item.meta.encode(), desc)
                with self._lock:
                    self.batches_sent += 1
                    self.shm_batches_sent += put is not None
        finally:
            reap()
            back = [item for _, _, item in sent]  # not received: the reader will never see them
            if pending is not None:
                back.append(pending)
            for item in reversed(back):
                self.feed.unserved(item, trainer)
            log.info(
                "shm stream %d (trainer %d): %d batches in shared memory, %d inline, %d slots, %d given back",
                pool.stream,
                trainer,
                pool.shm_batches,
                pool.inline_batches,
                len(pool.slots),
                len(back),
            )
            pool.close()
            with self._lock:
                self.active_streams -= 1

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        try:
            trainer, shm = parse_ticket(ticket.ticket, self.feed.trainers)
        except ValueError as exc:
            raise fl.FlightServerError(str(exc)) from None
        if shm and self.shm is None:
            raise fl.FlightServerError("this executor serves no shared memory (ask shm-info first)")
        schema = self.feed.wait_schema()
        if schema is None:
            return fl.GeneratorStream(pa.schema([]), iter(()))
        if shm:
            return fl.GeneratorStream(schema, self._shm_stream(trainer, schema, context))
        return fl.GeneratorStream(schema, self._stream(trainer))

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        if action.type != SHM_ACTION:
            raise fl.FlightServerError(f"unknown action {action.type!r}")
        if self.shm is None:
            raise fl.FlightServerError("this executor serves no shared memory")
        return iter([json.dumps(self.shm.info()).encode()])

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        return [(SHM_ACTION, "the shared-memory directory and probe nonce, for readers on this host")]

    def shutdown(self) -> None:
        """End every stream, stop the server, remove the shared-memory directory."""
        self._closing.set()
        super().shutdown()
        if self.shm is not None:
            self.shm.close()

    def idle(self) -> bool:
        with self._lock:
            return self.active_streams == 0
