"""The data driver over Arrow Flight: every :class:`DriverAPI` method is a ``DoAction`` with a JSON body.

:class:`DriverServer` wraps a :class:`~.state.DataDriver` (thread-safe: the driver's lock
serialises all calls), binds to loopback by default, can require a shared secret
(``authorization: Bearer <token>`` on every call, checked by a server middleware; wrong or
missing token → ``FlightUnauthenticatedError``) and runs a timer that expires overdue leases
every ``lease_s / 4``. The action names and JSON shapes are listed in :data:`.actions.ACTIONS`.

Example::

    server = DriverServer(DataDriver(lease_s=30), token="s3cret").serve_in_thread()
    client = DriverClient(server.location, token="s3cret")
    leases = client.lease("exec-0")
    server.shutdown()
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.flight as flight

from primus_dagster.data.driver.actions import (
    ACTIONS,
    CHUNK_BYTES,
    DEDUP_ACTIONS,
    batch_from_dict,
    completion_from_dict,
    error_info,
    lease_to_dict,
    member_from_dict,
    places_from_dict,
    report_from_dict,
    report_to_dict,
)
from primus_dagster.data.driver.api import quality_columns_from_dict
from primus_dagster.data.driver.client import DriverClient, DriverUnavailableError
from primus_dagster.data.driver.state import DataDriver
from primus_dagster.data.driver.task_record import DataFailedError
from primus_dagster.data.flight_auth import BearerTokenMiddlewareFactory
from primus_dagster.data.tasks import DataTask

__all__ = ["DriverClient", "DriverServer", "DriverUnavailableError"]

log = logging.getLogger(__name__)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
Handler = Callable[[DataDriver, dict[str, Any]], Any]


def _source_versions(driver: DataDriver, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("set") is not None:
        driver.source_versions = dict(body["set"])  # one attribute store: atomic
    return {"source_versions": dict(driver.source_versions)}


def _quality(counts: Any) -> dict[str, int] | None:
    return None if not counts else {str(rule): int(n) for rule, n in dict(counts).items()}


def _complete(driver: DataDriver, body: dict[str, Any]) -> dict[str, Any]:
    places, columns = body.get("places"), body.get("quality_columns")
    driver.complete(
        body["executor_id"],
        body["task_id"],
        int(body["rows"]),
        int(body["batches"]),
        _quality(body.get("quality")),
        places_from_dict(places) if places else None,
        quality_columns_from_dict(columns) if columns else None,
    )
    return {}


def _fail(driver: DataDriver, body: dict[str, Any]) -> dict[str, Any]:
    member = body.get("member")
    retryable = bool(body.get("retryable", True))
    driver.fail(
        body["executor_id"],
        body["task_id"],
        str(body["error"]),
        retryable,
        member_from_dict(member) if member else None,
    )
    return {}


def _raise_if_failed(driver: DataDriver, body: dict[str, Any]) -> dict[str, Any]:
    driver.raise_if_failed()
    return {}


HANDLERS: dict[str, Handler] = {
    "lease": lambda d, b: {
        "leases": [
            lease_to_dict(x)
            for x in d.lease(
                b["executor_id"],
                int(b.get("max_tasks", 1)),
                [completion_from_dict(c) for c in b.get("completed", ())],
            )
        ]
    },
    "heartbeat": lambda d, b: d.heartbeat(report_from_dict(b["report"])),
    "complete": _complete,
    "fail": _fail,
    "release": lambda d, b: {"released": d.release(b["executor_id"], [str(t) for t in b["task_ids"]])},
    "claim": lambda d, b: {"first": d.claim(b["trainer_id"], batch_from_dict(b["batch"]))},
    "claim_many": lambda d, b: {"first": d.claim_many(b["trainer_id"], [batch_from_dict(x) for x in b["batches"]])},
    "barrier": lambda d, b: {
        "snapshot": d.barrier(
            b["trainer_id"], [batch_from_dict(x) for x in b.get("consumed", [])], int(b["barrier_id"])
        )
    },
    "barrier_snapshot": lambda d, b: {"snapshot": d.barrier_snapshot()},
    "executors": lambda d, b: {"executors": {k: report_to_dict(v) for k, v in d.executors().items()}},
    "status": lambda d, b: d.status(),
    "add_tasks": lambda d, b: {"added": d.add_tasks(DataTask.from_dict(t) for t in b["tasks"])},
    "snapshot": lambda d, b: d.snapshot(),
    "source_versions": _source_versions,
    "expire": lambda d, b: {"expired": d.expire()},
    "raise_if_failed": _raise_if_failed,
    "failure_report": lambda d, b: {"failed_tasks": d.failure_report()},
    "task_info": lambda d, b: d.task_info(b["task_id"]),
    "task_order": lambda d, b: d.task_order(
        str(b["trainer_id"]), str(b["kind"]), int(b.get("start", 0)), int(b.get("limit", 64))
    ),
}
assert set(HANDLERS) == set(ACTIONS)


class DriverServer(flight.FlightServerBase):
    """Serves a :class:`DataDriver` over Flight ``DoAction`` (see the module docstring).

    The server listens from construction on; :meth:`serve_in_thread` starts the lease-expiry
    timer, :meth:`shutdown` stops both. ``port=0`` picks a free port (see :attr:`location`).

    Example::

        with DriverServer(driver) as server:
            DriverClient(server.location).status()
    """

    def __init__(
        self,
        driver: DataDriver,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        dedup_entries: int = 4096,
    ):
        self.driver = driver
        self.host = host
        self._token = token
        if token is None and host not in LOOPBACK:
            log.warning("data driver listens on %s without a token: anyone who reaches it can lease and claim", host)
        middleware = {} if token is None else {"auth": BearerTokenMiddlewareFactory(token, "data driver")}
        super().__init__(f"grpc://{self._netloc(host, port)}", middleware=middleware)
        self._dedup: OrderedDict[str, bytes] = OrderedDict()
        self._dedup_entries = dedup_entries
        self._dedup_lock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._closed = False

    @staticmethod
    def _netloc(host: str, port: int) -> str:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def location(self) -> str:
        """``grpc://host:port`` of this server (what :class:`DriverClient` takes)."""
        return f"grpc://{self._netloc(self.host, self.port)}"

    # -- Flight -----------------------------------------------------------------------------
    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return sorted(ACTIONS.items())

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        kind = action.type
        handler = HANDLERS.get(kind)
        if handler is None:
            err = ValueError(f"unknown data driver action {kind!r} (known: {', '.join(sorted(HANDLERS))})")
            raise flight.FlightServerError(str(err), error_info(err))
        try:
            raw = action.body.to_pybytes() if action.body is not None else b""
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise ValueError(f"action {kind}: the body must be a JSON object")
            request_id = body.pop("request_id", None) if kind in DEDUP_ACTIONS else None
            payload = self._dispatch(kind, handler, body, request_id)
        except flight.FlightError:
            raise
        except (DataFailedError, KeyError, ValueError, TypeError) as err:
            raise flight.FlightServerError(f"{kind}: {err}", error_info(err)) from None
        return (payload[i : i + CHUNK_BYTES] for i in range(0, max(len(payload), 1), CHUNK_BYTES))

    def _dispatch(self, kind: str, handler: Handler, body: dict[str, Any], request_id: str | None) -> bytes:
        if request_id is None:
            return json.dumps(handler(self.driver, body)).encode()
        with self._dedup_lock:  # a retried lease / claim gets the first call's answer
            cached = self._dedup.get(request_id)
            if cached is None:
                cached = json.dumps(handler(self.driver, body)).encode()
                self._dedup[request_id] = cached
                while len(self._dedup) > self._dedup_entries:
                    self._dedup.popitem(last=False)
            return cached

    # -- lifecycle --------------------------------------------------------------------------
    def serve_in_thread(self) -> DriverServer:
        """Start the lease-expiry timer (the server already accepts calls); returns ``self``."""
        if self._timer is None:
            interval = max(0.01, self.driver.lease_s / 4)
            self._timer = threading.Thread(
                target=self._expire_loop, args=(interval,), name="driver-expiry", daemon=True
            )
            self._timer.start()
        return self

    def _expire_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.driver.expire()
            except Exception:  # keep the timer alive; the next call reports the problem
                log.exception("data driver lease expiry failed")

    def shutdown(self) -> None:
        """Stop the timer and the server (waits for calls in flight); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=5)
        super().shutdown()

    def __enter__(self) -> DriverServer:
        return self.serve_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
