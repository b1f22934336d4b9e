"""JSON shapes of the driver's Flight actions (shared by :mod:`.server` and :mod:`.client`).

Every action's body and response is one JSON object (a response may come back in several
``Result`` chunks of at most :data:`CHUNK_BYTES`, which the client joins). Errors travel as
``FlightServerError`` whose ``extra_info`` is ``{"type", "message"}`` (+ ``report``, ``total``,
``threshold`` for ``DataFailedError``) and are raised again as the same type by the client.

Example::

    body = {"trainer_id": "t0", "batch": batch_to_dict(BatchId("s:f", 0, 1024))}
    assert batch_from_dict(body["batch"]) == BatchId("s:f", 0, 1024)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from primus_dagster.data.driver.api import Completion, ExecutorReport, Lease, MemberFailure, quality_columns_from_dict
from primus_dagster.data.driver.task_record import DataAbortedError, DataFailedError
from primus_dagster.data.tasks import BatchId, DataTask

CHUNK_BYTES = 1 << 20

#: action -> (request body, response); ``request_id`` (a client uuid) makes a retried call
#: of a non-idempotent action (lease, claim, claim_many) return the first call's answer.
ACTIONS: dict[str, str] = {
    "lease": '{"executor_id", "max_tasks", "request_id"} -> {"leases": [lease]}',
    "heartbeat": '{"report": report} -> {"cancel": [task_id], "done", "failed", "deadline"}',
    "complete": '{"executor_id", "task_id", "rows", "batches", "quality"?: {rule: rows}, '
    '"places"?: {uri: {rule: rows}}} -> {}',
    "fail": '{"executor_id", "task_id", "error", "retryable"?: bool, "member"?: member} -> {}',
    "release": '{"executor_id", "task_ids": [task_id]} -> {"released": [task_id]}',
    "claim": '{"trainer_id", "batch": batch, "request_id"} -> {"first": bool}',
    "claim_many": '{"trainer_id", "batches": [batch], "request_id"} -> {"first": [bool]}',
    "barrier": '{"trainer_id", "consumed": [batch], "barrier_id"} -> {"snapshot": snapshot | null}',
    "barrier_snapshot": '{} -> {"snapshot": snapshot | null}',
    "executors": '{} -> {"executors": {executor_id: report}}',
    "status": "{} -> status",
    "add_tasks": '{"tasks": [DataTask.to_dict()]} -> {"added": int}',
    "snapshot": "{} -> snapshot",
    "source_versions": '{"set": {..} | null} -> {"source_versions": {..}}',
    "expire": '{} -> {"expired": [task_id]}',
    "raise_if_failed": "{} -> {} (or a DataFailedError / DataAbortedError)",
    "failure_report": '{} -> {"failed_tasks": [{"task_id", "uri", "attempts", "failures", "error"}]}',
    "task_info": '{"task_id"} -> task info',
    "task_order": '{"trainer_id", "kind", "start", "limit"} -> {"total", "planned", "window", "done", "failed", '
    '"tasks": [[task_id, sealed, failed]]}',
}
#: lease  = {"task": DataTask.to_dict(), "attempt": int, "deadline": float, "claimed_rows": [int]}
#: report = {"executor_id", "address", "running": [task_id], "metrics": {name: float}}
#: batch  = {"task_id", "first_row", "rows"}
#: member = {"uri", "retryable", "served_members"} (a file of a pack failed: MemberFailure)
#: completion = {"task_id", "rows", "batches", "quality"?: {rule: rows}, "places"?: {uri: {rule: rows}}}
DEDUP_ACTIONS = frozenset({"lease", "claim", "claim_many"})


def lease_to_dict(lease: Lease) -> dict[str, Any]:
    return {
        "task": lease.task.to_dict(),
        "attempt": lease.attempt,
        "deadline": lease.deadline,
        "claimed_rows": list(lease.claimed_rows),
        "place": lease.place,
    }


def lease_from_dict(data: dict[str, Any]) -> Lease:
    return Lease(
        task=DataTask.from_dict(data["task"]),
        attempt=int(data["attempt"]),
        deadline=float(data["deadline"]),
        claimed_rows=tuple(int(r) for r in data.get("claimed_rows", ())),
        place=int(data.get("place", 0)),
    )


def report_to_dict(report: ExecutorReport) -> dict[str, Any]:
    return asdict(report)


def report_from_dict(data: dict[str, Any]) -> ExecutorReport:
    return ExecutorReport(
        executor_id=data["executor_id"],
        address=data.get("address", ""),
        running=list(data.get("running", [])),
        metrics=dict(data.get("metrics", {})),
    )


def batch_to_dict(batch: BatchId) -> dict[str, Any]:
    return {"task_id": batch.task_id, "first_row": batch.first_row, "rows": batch.rows}


def batch_from_dict(data: dict[str, Any]) -> BatchId:
    return BatchId(task_id=data["task_id"], first_row=int(data["first_row"]), rows=int(data["rows"]))


def completion_to_dict(done: Completion) -> dict[str, Any]:
    out: dict[str, Any] = {"task_id": done.task_id, "rows": done.rows, "batches": done.batches}
    if done.quality:
        out["quality"] = done.quality
    if done.places:
        out["places"] = done.places
    if done.quality_columns:
        out["quality_columns"] = done.quality_columns
    return out


def completion_from_dict(data: dict[str, Any]) -> Completion:
    quality = {str(rule): int(n) for rule, n in dict(data["quality"]).items()} if data.get("quality") else None
    places = places_from_dict(data["places"]) if data.get("places") else None
    columns = quality_columns_from_dict(data["quality_columns"]) if data.get("quality_columns") else None
    return Completion(str(data["task_id"]), int(data["rows"]), int(data["batches"]), quality, places, columns)


def member_to_dict(member: MemberFailure) -> dict[str, Any]:
    return asdict(member)


def member_from_dict(data: dict[str, Any]) -> MemberFailure:
    return MemberFailure(str(data["uri"]), bool(data.get("retryable", True)), int(data.get("served_members", 0)))


def places_from_dict(data: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Quality counts per file of a pack (``{uri: {rule: rows}}``) as sent by ``complete``."""
    return {str(uri): {str(rule): int(n) for rule, n in dict(counts).items()} for uri, counts in dict(data).items()}


def error_info(err: BaseException) -> bytes:
    """``extra_info`` of the FlightServerError that carries ``err`` to the client."""
    message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    info: dict[str, Any] = {"type": type(err).__name__, "message": str(message)}
    if isinstance(err, DataFailedError):
        info.update(report=err.report, total=err.total, threshold=err.threshold)
    return json.dumps(info).encode()


def error_from_info(extra_info: bytes, fallback: Exception) -> Exception:
    """The client-side exception for a FlightServerError's ``extra_info`` (``fallback`` if none)."""
    try:
        info = json.loads(extra_info)
        kind, message = info["type"], info["message"]
    except (ValueError, TypeError, KeyError):
        return fallback
    if kind == "DataFailedError":
        return DataFailedError(info["report"], int(info["total"]), float(info["threshold"]))
    known: dict[str, type[Exception]] = {
        "KeyError": KeyError,
        "ValueError": ValueError,
        "TypeError": TypeError,
        "DataAbortedError": DataAbortedError,
    }
    if kind in known:
        return known[kind](message)
    return RuntimeError(f"data driver error ({kind}): {message}")
