"""The dataset server: an Arrow Flight server in the data executor process.

``DoGet`` with ticket ``{"trainer": i}`` (JSON) streams trainer ``i``'s buffered batches, each
with its :class:`~primus_dagster.data.executor.wire.BatchMeta` as Flight ``app_metadata``,
until the executor has no more work for that trainer (then the stream ends cleanly). With a
token, every call must carry ``authorization: Bearer <token>``.

The server only talks to a :class:`BatchFeed` (the executor), so it holds no task logic.

Example::

    server = DatasetServer(executor, host="127.0.0.1", port=0, token="s3cret")
    print(server.location)            # grpc://127.0.0.1:PORT
    ...
    server.shutdown()
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from typing import Any, Iterator, Protocol

import pyarrow as pa
import pyarrow.flight as fl

from primus_dagster.data.executor.wire import decode_ticket

log = logging.getLogger(__name__)


class Served(Protocol):
    wire: pa.RecordBatch
    raw_meta: bytes


class BatchFeed(Protocol):
    """What the dataset server needs from the executor."""

    trainers: int

    def wait_schema(self, timeout: float | None = None) -> pa.Schema | None:
        """The wire schema of this executor's batches; None when no batch will ever come."""

    def next_for(self, trainer: int) -> Served | None:
        """Block for ``trainer``'s next batch; None once there is no more work for it."""

    def served(self, item: Served) -> None:
        """``item`` was handed to the transport."""

    def unserved(self, item: Served, trainer: int) -> None:
        """``item`` was taken but its stream broke before it was handed over: take it back."""


class _BearerAuthFactory(fl.ServerMiddlewareFactory):
    """Rejects calls whose ``authorization`` header is not ``Bearer <token>``."""

    def __init__(self, token: str):
        super().__init__()
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        for value in headers.get("authorization", []):
            raw = value if isinstance(value, bytes) else str(value).encode()
            if hmac.compare_digest(raw, self._expected):
                return None
        raise fl.FlightUnauthenticatedError("missing or wrong bearer token for the dataset server")


def bearer_options(token: str | None, timeout: float | None = None) -> fl.FlightCallOptions:
    """Call options carrying ``authorization: Bearer <token>`` (or none)."""
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return fl.FlightCallOptions(headers=headers, timeout=timeout)


class DatasetServer(fl.FlightServerBase):
    """Flight server streaming a :class:`BatchFeed`'s per-trainer buffers (see module docstring)."""

    def __init__(self, feed: BatchFeed, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 slow_ms_per_batch: float = 0.0, advertise: str | None = None):
        if token is None and host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("dataset server listens on %s without a token: anyone who reaches it can read batches", host)
        middleware = {"auth": _BearerAuthFactory(token)} if token else None
        super().__init__(f"grpc://{host}:{port}", middleware=middleware)
        self.feed = feed
        self.slow_s = max(0.0, slow_ms_per_batch) / 1000.0
        self.location = f"grpc://{advertise or host}:{self.port}"
        self._lock = threading.Lock()
        self.active_streams = 0
        self.batches_sent = 0

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
                    time.sleep(self.slow_s)
                pending = item
                yield item.wire, item.raw_meta
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

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        try:
            trainer = decode_ticket(ticket.ticket, self.feed.trainers)
        except ValueError as exc:
            raise fl.FlightServerError(str(exc)) from None
        schema = self.feed.wait_schema()
        if schema is None:
            return fl.GeneratorStream(pa.schema([]), iter(()))
        return fl.GeneratorStream(schema, self._stream(trainer))

    def idle(self) -> bool:
        with self._lock:
            return self.active_streams == 0
