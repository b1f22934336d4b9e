"""``DriverClient``: the :class:`~.api.DriverAPI` over Flight ``DoAction`` calls to a ``DriverServer``.

Transient unavailability (driver restarting, connection refused, timeout) is retried with a
short exponential backoff for up to ``retry_s``; after that :class:`DriverUnavailableError`
names the address. Non-idempotent calls (``lease``, ``claim``, ``claim_many``) carry a request
id, so a retry of a call that did reach the driver gets the first answer (a claim is never
answered False to the reader that made it). Errors raised by the driver come back as the same
type (``KeyError``, ``ValueError``, :class:`DataFailedError` with its report).

Example::

    client = DriverClient("grpc://127.0.0.1:7400", token="s3cret")
    for lease in client.lease("exec-0", max_tasks=2):
        ...
    client.complete("exec-0", lease.task.task_id, rows=4096, batches=4)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow.flight as flight

from primus_dagster.data.driver.actions import (
    DEDUP_ACTIONS,
    batch_to_dict,
    completion_to_dict,
    error_from_info,
    lease_from_dict,
    member_to_dict,
    report_from_dict,
    report_to_dict,
)
from primus_dagster.data.driver.api import Completion, ExecutorReport, Lease, MemberFailure
from primus_dagster.data.tasks import BatchId, DataTask

ADD_TASKS_CHUNK = 2000


class DriverUnavailableError(ConnectionError):
    """The data driver could not be reached within the retry time; the message names its address."""


class DriverClient:
    """:class:`~.api.DriverAPI` over Arrow Flight (see the module docstring).

    ``location``: ``grpc://host:port`` (a bare ``host:port`` is accepted). ``timeout_s`` bounds one
    call, ``retry_s`` the retrying of an unreachable driver.

    Example::

        with DriverClient(server.location) as client:
            assert client.claim("trainer-0", BatchId("s:f", 0, 1024))
    """

    def __init__(self, location: str, token: str | None = None, *, timeout_s: float = 60.0, retry_s: float = 10.0):
        self.location = location if "://" in location else f"grpc://{location}"
        self.retry_s = retry_s
        self._client = flight.FlightClient(self.location)
        headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
        self._options = flight.FlightCallOptions(headers=headers, timeout=timeout_s)

    # -- transport --------------------------------------------------------------------------
    def call(self, action: str, body: dict[str, Any] | None = None) -> Any:
        """Run one driver action (names and shapes: :data:`.actions.ACTIONS`); returns the decoded JSON."""
        payload = dict(body or {})
        if action in DEDUP_ACTIONS:
            payload["request_id"] = uuid.uuid4().hex
        request = flight.Action(action, json.dumps(payload).encode())
        give_up = time.monotonic() + self.retry_s
        delay, tries = 0.02, 0
        while True:
            tries += 1
            try:
                raw = b"".join(r.body.to_pybytes() for r in self._client.do_action(request, self._options))
                return json.loads(raw) if raw else None
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as err:
                if time.monotonic() + delay > give_up:
                    raise DriverUnavailableError(
                        f"data driver at {self.location} unreachable ({action}, {tries} tries in "
                        f"{self.retry_s:g}s): {err}"
                    ) from err
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except flight.FlightServerError as err:
                raise error_from_info(err.extra_info, err) from None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> DriverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- DriverAPI --------------------------------------------------------------------------
    def lease(self, executor_id: str, max_tasks: int = 1, completed: Sequence[Completion] = ()) -> list[Lease]:
        body: dict[str, Any] = {"executor_id": executor_id, "max_tasks": max_tasks}
        if completed:
            body["completed"] = [completion_to_dict(c) for c in completed]
        reply = self.call("lease", body)
        return [lease_from_dict(x) for x in reply["leases"]]

    def heartbeat(self, report: ExecutorReport) -> dict[str, Any]:
        return self.call("heartbeat", {"report": report_to_dict(report)})

    def complete(
        self,
        executor_id: str,
        task_id: str,
        rows: int,
        batches: int,
        quality: dict[str, int] | None = None,
        places: dict[str, dict[str, int]] | None = None,
        quality_columns: dict[str, list[str]] | None = None,
    ) -> None:
        body: dict[str, Any] = {"executor_id": executor_id, "task_id": task_id, "rows": rows, "batches": batches}
        if quality:
            body["quality"] = quality
        if places:
            body["places"] = places
        if quality_columns:
            body["quality_columns"] = quality_columns
        self.call("complete", body)

    def fail(
        self, executor_id: str, task_id: str, error: str, retryable: bool = True, member: MemberFailure | None = None
    ) -> None:
        body: dict[str, Any] = {"executor_id": executor_id, "task_id": task_id, "error": error}
        if not retryable:
            body["retryable"] = False
        if member is not None:
            body["member"] = member_to_dict(member)
        self.call("fail", body)

    def release(self, executor_id: str, task_ids: list[str]) -> list[str]:
        return list(self.call("release", {"executor_id": executor_id, "task_ids": list(task_ids)})["released"])

    def claim(self, trainer_id: str, batch: BatchId) -> bool:
        return bool(self.call("claim", {"trainer_id": trainer_id, "batch": batch_to_dict(batch)})["first"])

    def claim_many(self, trainer_id: str, batches: Iterable[BatchId]) -> list[bool]:
        """:meth:`claim` for several batches in one round trip."""
        body = {"trainer_id": trainer_id, "batches": [batch_to_dict(b) for b in batches]}
        return [bool(x) for x in self.call("claim_many", body)["first"]]

    def barrier(self, trainer_id: str, consumed: list[BatchId], barrier_id: int) -> dict[str, Any] | None:
        body = {"trainer_id": trainer_id, "consumed": [batch_to_dict(b) for b in consumed], "barrier_id": barrier_id}
        return self.call("barrier", body)["snapshot"]

    def executors(self) -> dict[str, ExecutorReport]:
        return {k: report_from_dict(v) for k, v in self.call("executors")["executors"].items()}

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def task_order(self, trainer_id: str, kind: str, start: int = 0, limit: int = 64) -> dict[str, Any]:
        body = {"trainer_id": trainer_id, "kind": kind, "start": start, "limit": limit}
        return self.call("task_order", body)

    # -- the rest of DataDriver's surface ---------------------------------------------------
    def add_tasks(self, tasks: Iterable[DataTask]) -> int:
        """Register tasks (idempotent by id), sent in chunks of :data:`ADD_TASKS_CHUNK`."""
        added, chunk = 0, []
        for task in tasks:
            chunk.append(task.to_dict())
            if len(chunk) >= ADD_TASKS_CHUNK:
                added += self.call("add_tasks", {"tasks": chunk})["added"]
                chunk = []
        if chunk:
            added += self.call("add_tasks", {"tasks": chunk})["added"]
        return added

    def snapshot(self) -> dict[str, Any]:
        return self.call("snapshot")

    def barrier_snapshot(self) -> dict[str, Any] | None:
        return self.call("barrier_snapshot")["snapshot"]

    @property
    def source_versions(self) -> dict[str, Any]:
        """The driver's source versions (a copy: assign the whole dict to change them)."""
        return self.call("source_versions", {"set": None})["source_versions"]

    @source_versions.setter
    def source_versions(self, versions: dict[str, Any]) -> None:
        self.call("source_versions", {"set": dict(versions)})

    def expire(self) -> list[str]:
        return self.call("expire")["expired"]

    def raise_if_failed(self) -> None:
        self.call("raise_if_failed")

    def failure_report(self) -> list[dict[str, Any]]:
        return self.call("failure_report")["failed_tasks"]

    def task_info(self, task_id: str) -> dict[str, Any]:
        return self.call("task_info", {"task_id": task_id})
