"""Next-hour evaluation: score the model on the hours right after its training window
(the metrics themselves are in :mod:`.metrics`).

The held-out data is read in this process through the source adapters (no data plane: it is a
few hours). Labels come from the ``batch`` streams when those hours are there -- complete labels,
the honest measure -- and otherwise from the ``stream`` sources, whose labels are incomplete
(clicks later than the stream's label window are missing), which :attr:`NextHourEvaluation.labels` says.

Example::

    held = evaluate_window(job, context, model, window.end, window.end + timedelta(hours=1), train_start=window.start)
    held.result.auc if held else "no data after the window yet"
    held.baseline.popularity_feature, held.baseline.popularity_auc   # the prior (None: no sparse features)
    ok, reason = held.verdict()                                      # above chance and the prior?

With ``train_start`` the model is also judged against a trivial baseline
(:mod:`~primus_dagster.training.baseline`): a popularity prior counted on the training window's rows
(the tasks the run trained on, :func:`~primus_dagster.training.planning.plan_training_tasks`: batch
rows where the window has any, else stream rows; the first ``max_rows`` labelled rows) and scored on
the very held-out rows the model is scored on (one read of them).

The *final* evaluation scores the same hours once their labels are complete (:func:`labels_complete_at`):
only on :func:`final_labels` (the batch sources' complete labels where the job has any)::

    if now >= labels_complete_at(job, window.end):
        final = evaluate_window(job, context, model, window.end, eval_end(job, window.end), labels=(final_labels(job),))
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from primus_dagster.data import Batch, DataTask, Planner, SourceContext, TimeWindow, read_batches
from primus_dagster.spec import JobSpec, granularity_step
from primus_dagster.training.baseline import (
    CHANCE_MARGIN,
    BaselineVerdict,
    PopularityPrior,
    PriorScores,
    verdict,
    verdict_text,
)
from primus_dagster.training.final_eval import eval_end, final_labels, labels_complete_at
from primus_dagster.training.metrics import EvalResult, evaluate
from primus_dagster.training.models import RecModel
from primus_dagster.training.planning import NoTrainingDataError, plan_training_tasks

__all__ = [
    "NextHourEvaluation",
    "eval_end",
    "evaluate_window",
    "final_labels",
    "fit_popularity_prior",
    "labels_complete_at",
]

log = logging.getLogger(__name__)


@dataclass
class NextHourEvaluation:
    """An evaluation on held-out hours: the result, which labels it used (batch | stream), and the
    popularity prior scored on the same rows (``baseline``; None: not asked for, no sparse features,
    or no labelled training rows)."""

    result: EvalResult
    labels: str
    window: TimeWindow
    baseline: BaselineVerdict | None = None

    def verdict(self, margin: float = CHANCE_MARGIN) -> tuple[bool, str]:
        """``(ok, reason)`` of :func:`~primus_dagster.training.baseline.verdict` for this AUC and prior."""
        return verdict(self.result.auc, self.baseline, margin)

    def verdict_text(self, margin: float = CHANCE_MARGIN) -> str:
        """The one-line verdict (:func:`~primus_dagster.training.baseline.verdict_text`)."""
        return verdict_text(self.result.auc, self.baseline, margin)


def fit_popularity_prior(
    job: JobSpec, context: SourceContext, train_window: TimeWindow, *, max_rows: int | None = 2_000_000
) -> PopularityPrior | None:
    """The popularity prior of the rows a run on ``train_window`` trains on, read in this process: the
    window's training tasks (:func:`~primus_dagster.training.planning.plan_training_tasks`, so the batch
    sources shifted back by ``training.batch_lag``), the batch ones where there are any, else the stream
    ones; at most ``max_rows`` labelled rows. None when no row there is labelled (or nothing is ready)."""
    try:
        tasks = plan_training_tasks(job, context, train_window)
    except NoTrainingDataError as exc:
        log.warning("popularity prior: no training rows in %s (%s)", train_window, exc)
        return None
    for kind in ("batch", "stream"):
        chosen = [t for t in tasks if t.kind == kind]
        if chosen:
            prior = PopularityPrior().fit(read_batches(job, context, chosen), max_rows=max_rows)
            if prior.rows:
                log.info("popularity prior: %d labelled %s row(s) of %s", prior.rows, kind, train_window)
                return prior
    log.warning("popularity prior: no labelled training rows in %s", train_window)
    return None


def scored_window(job: JobSpec, tasks: Sequence[DataTask]) -> TimeWindow:
    """The time the rows of ``tasks`` cover: from the first partition's start to the last one's end (a daily
    source's partition is a whole day, however short the window asked for)."""
    spans = [
        (t.partition, t.partition + granularity_step(job.dataset.source(t.read.source).granularity)) for t in tasks
    ]
    return TimeWindow(min(a for a, _ in spans), max(b for _, b in spans))


def evaluate_window(
    job: JobSpec,
    context: SourceContext,
    model: RecModel,
    start: datetime,
    end: datetime,
    *,
    max_rows: int | None = 2_000_000,
    labels: Sequence[str] = ("batch", "stream"),
    train_start: datetime | None = None,
) -> NextHourEvaluation | None:
    """Evaluate ``model`` on ``[start, end)``; None when no source has data there yet. ``labels``: the
    source kinds to take the held-out rows from, the first that has tasks wins (default: batch, else stream).

    ``train_start``: the start of the training window (which ends at ``start``): the popularity prior is
    counted on its training rows (:func:`fit_popularity_prior`, at most ``max_rows``) and scored on the
    same held-out rows as the model (``NextHourEvaluation.baseline``); None: no prior."""
    window = TimeWindow(start, end)
    with Planner.for_job(job, context) as planner:
        tasks = list(planner.plan(window).tasks)
    for kind in labels:
        chosen = [t for t in tasks if t.kind == kind]
        if not chosen:
            continue
        if kind == "stream" and "batch" in labels:
            log.warning("no batch data after the window yet: evaluating on the stream's incomplete labels")
        prior = None
        if train_start is not None:
            prior = fit_popularity_prior(job, context, TimeWindow(train_start, start), max_rows=max_rows)
        scores = PriorScores(prior) if prior is not None else None
        batches: Iterator[Batch] = read_batches(job, context, chosen)
        if scores is not None:
            batches = scores.watch(batches, max_rows)
        try:
            result = evaluate(model, batches, max_rows=max_rows)
        except ValueError as exc:  # no rows
            log.warning("held-out evaluation on %s: %s", window, exc)
            return None
        baseline = scores.baseline() if scores is not None else None
        if baseline is not None:
            log.info(
                "popularity prior: AUC %.4f on %s (%s)",
                baseline.popularity_auc,
                baseline.popularity_feature,
                ", ".join(f"{name} {value:.4f}" for name, value in baseline.aucs.items()),
            )
        scored = scored_window(job, chosen)
        if scored != window:
            log.info("evaluation: the %s partition(s) read cover %s (asked: %s)", kind, scored, window)
        return NextHourEvaluation(result, kind, scored, baseline)
    log.warning("no %s data after the window (%s) to evaluate on", "/".join(labels), window)
    return None
