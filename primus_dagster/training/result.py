"""What a window run produced: :class:`TrainingResult` (also the training asset's metadata).

Example::

    result = train_window(request)
    result.evaluation.result.auc, result.run_id, result.model_uri, result.metadata()["samples"]
    result.failed_tasks[0]["where"]      # a file given up below data.failed_task_threshold (else no rows)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from primus_dagster.data import NotReady, TimeWindow
from primus_dagster.training.checkpoint import Checkpoint
from primus_dagster.training.evaluation import NextHourEvaluation
from primus_dagster.training.failed_tasks import run_failed_tasks
from primus_dagster.training.quality_report import QUALITY_PLACES_KEPT, quality_places_text
from primus_dagster.training.run_state import TrainingRun


@dataclass
class TrainingResult:
    """What a job produced (also the training asset's metadata, see :meth:`metadata`)."""

    run_id: str
    run_url: str
    model_uri: str | None
    window: TimeWindow
    stats: dict[str, Any]
    evaluation: NextHourEvaluation | None
    source_versions: dict[str, Any]
    checkpoints: list[int] = field(default_factory=list)
    resumed_from_step: int | None = None
    warm_started_from: str | None = None  # MLflow run id
    cold_start: str | None = None  # why a run asked to warm-start began from a fresh model
    wall_s: float = 0.0
    data_pools: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase -> executors, restarts, scaling
    skipped_partitions: list[dict[str, Any]] = field(default_factory=list)  # not ready inside the window
    consumed: dict[str, dict[str, Any]] = field(default_factory=dict)  # per source: see consumed_sources
    data_quality: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> quality rule -> rows touched
    # source -> quality rule -> ["<file or offset range>: N rows", ..., "... and N more"]
    data_quality_where: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # tasks given up below data.failed_task_threshold: {"phase", "source", "partition", "where", "error",
    # "attempts", "failures", "task_id"} each (training.failed_tasks); their partitions are in ``consumed``'s
    # ``incomplete_partitions``
    failed_tasks: list[dict[str, Any]] = field(default_factory=list)
    # ready partitions of the window without a row: {"source", "partition", "reason"} each
    empty_partitions: list[dict[str, str]] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mlflow_run_id": self.run_id,
            "mlflow_run_url": self.run_url,
            "model_uri": self.model_uri or "",
            "window_start": self.window.start.isoformat(),
            "window_end": self.window.end.isoformat(),
            "samples": self.stats.get("samples", 0),
            "steps": self.stats.get("step", 0),
            "samples_per_s": self.stats.get("samples_per_s", 0.0),
            "kernels": self.stats.get("kernels", "eager"),
            "wall_s": round(self.wall_s, 2),
            "checkpoints": len(self.checkpoints),
            "resumed_from_step": self.resumed_from_step,
            "warm_started_from": self.warm_started_from,
            "cold_start": self.cold_start,
            "source_versions": self.source_versions,
            "data_pools": self.data_pools,
            "skipped_partitions": self.skipped_partitions,
            "empty_partitions": self.empty_partitions,
            "consumed_partitions": {name: entry["partitions"] for name, entry in self.consumed.items()},
            "data_quality": self.data_quality,
            "data_quality_rows": sum(n for counts in self.data_quality.values() for n in counts.values()),
            "data_quality_where": self.data_quality_where,
            "failed_task_count": len(self.failed_tasks),
            "failed_tasks": self.failed_tasks,
            # partitions read by a task given up: not consumed in full
            "incomplete_partitions": {
                name: entry["incomplete_partitions"]
                for name, entry in self.consumed.items()
                if entry.get("incomplete_partitions")
            },
        }
        if self.evaluation is not None:
            out.update({f"eval_{k}": v for k, v in self.evaluation.result.to_dict().items()})
            out["eval_labels"] = self.evaluation.labels
            out["eval_window"] = f"{self.evaluation.window.start.isoformat()}/{self.evaluation.window.end.isoformat()}"
            baseline = self.evaluation.baseline
            if baseline is not None:  # the popularity prior on the same held-out rows
                out["popularity_auc"] = baseline.popularity_auc
                out["popularity_feature"] = baseline.popularity_feature
                out["popularity_aucs"] = dict(baseline.aucs)
            # the guard: above chance and the prior ("AUC … vs popularity prior …: ok" / "…: BELOW BASELINE: …")
            out["baseline_verdict"] = self.evaluation.verdict_text()
        return out


def build_result(
    run: TrainingRun,
    model_uri: str | None,
    stats: dict[str, Any],
    evaluation: NextHourEvaluation | None,
    resume: Checkpoint | None,
    warm_from: str | None,
    cold_start: str | None,
    started: float,
    skipped: list[NotReady],
) -> TrainingResult:
    """The result of a finished run (``started``: its ``time.perf_counter()`` at the start)."""
    return TrainingResult(
        run_id=run.tracker.require_run_id(),
        run_url=run.tracker.run_url,
        model_uri=model_uri,
        window=run.request.window,
        stats=stats,
        evaluation=evaluation,
        source_versions=run.versions,
        checkpoints=run.checkpoints,
        resumed_from_step=None if resume is None else resume.step,
        warm_started_from=warm_from,
        cold_start=cold_start,
        wall_s=time.perf_counter() - started,
        data_pools=run.data_pools,
        consumed=run.consumed,
        data_quality=run.data_quality,
        data_quality_where={
            name: quality_places_text(places, QUALITY_PLACES_KEPT)
            for name, places in sorted(run.quality_places.items())
        },
        skipped_partitions=[
            {"source": n.source, "partition": n.partition.isoformat(), "reason": n.reason} for n in skipped
        ],
        failed_tasks=run_failed_tasks(run),
        empty_partitions=[e.to_dict() for e in run.empty_partitions],
    )
