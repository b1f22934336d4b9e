"""Next-hour evaluation: score the model on the hours right after its training window
(the metrics themselves are in :mod:`.metrics`).

The held-out data is read in this process through the source adapters (no data plane: it is a
few hours). Labels come from the ``batch`` streams when those hours are there -- complete labels,
the honest measure -- and otherwise from the ``stream`` sources, whose labels are incomplete
(clicks later than the stream's label window are missing), which :attr:`NextHourEvaluation.labels` says.

Example::

    held = evaluate_window(job, context, model, window.end, window.end + timedelta(hours=1))
    held.result.auc if held else "no data after the window yet"

The *final* evaluation scores the same hours once their labels are complete (:func:`labels_complete_at`):
only on :func:`final_labels` (the batch sources' complete labels where the job has any)::

    if now >= labels_complete_at(job, window.end):
        final = evaluate_window(job, context, model, window.end, eval_end(job, window.end), labels=(final_labels(job),))
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from primus_dagster.data import Planner, SourceContext, TimeWindow, read_batches
from primus_dagster.spec import JobSpec
from primus_dagster.training.final_eval import eval_end, final_labels, labels_complete_at
from primus_dagster.training.metrics import EvalResult, evaluate
from primus_dagster.training.models import RecModel

__all__ = ["NextHourEvaluation", "eval_end", "evaluate_window", "final_labels", "labels_complete_at"]

log = logging.getLogger(__name__)


@dataclass
class NextHourEvaluation:
    """An evaluation on held-out hours: the result and which labels it used (batch | stream)."""

    result: EvalResult
    labels: str
    window: TimeWindow


def evaluate_window(
    job: JobSpec,
    context: SourceContext,
    model: RecModel,
    start: datetime,
    end: datetime,
    *,
    max_rows: int | None = 2_000_000,
    labels: Sequence[str] = ("batch", "stream"),
) -> NextHourEvaluation | None:
    """Evaluate ``model`` on ``[start, end)``; None when no source has data there yet. ``labels``: the
    source kinds to take the held-out rows from, the first that has tasks wins (default: batch, else stream)."""
    window = TimeWindow(start, end)
    with Planner.for_job(job, context) as planner:
        tasks = list(planner.plan(window).tasks)
    for kind in labels:
        chosen = [t for t in tasks if t.kind == kind]
        if not chosen:
            continue
        if kind == "stream" and "batch" in labels:
            log.warning("no batch data after the window yet: evaluating on the stream's incomplete labels")
        try:
            result = evaluate(model, read_batches(job, context, chosen), max_rows=max_rows)
        except ValueError as exc:  # no rows
            log.warning("held-out evaluation on %s: %s", window, exc)
            return None
        return NextHourEvaluation(result, kind, window)
    log.warning("no %s data after the window (%s) to evaluate on", "/".join(labels), window)
    return None
