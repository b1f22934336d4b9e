"""When the final evaluation of a training window may run: pure spec arithmetic (no torch), so that
schedules compute it when their definitions load.

The next-hour evaluation at the end of training scores the ``eval_hours`` after the window on whatever
labels exist then; the final one scores the same hours on complete labels: those of :func:`final_labels`
(the batch sources where the job has any), complete :func:`labels_complete_at` the end of those hours
plus the sources' largest ``label_delay``.

Example::

    if now >= labels_complete_at(job, window.end):
        evaluate_window(job, context, model, window.end, eval_end(job, window.end), labels=(final_labels(job),))
"""

from __future__ import annotations

from datetime import datetime, timedelta

from primus_dagster.spec import JobSpec


def eval_end(job: JobSpec, window_end: datetime) -> datetime:
    """The end of the held-out hours after a training window that ends at ``window_end``."""
    return window_end + timedelta(hours=job.training.eval_hours)


def final_labels(job: JobSpec) -> str:
    """The source kind whose labels the final evaluation uses: ``batch`` where the job has batch sources
    (complete labels), else ``stream``."""
    kinds = {source.kind for _, source in job.dataset.all_sources()}
    return "batch" if "batch" in kinds else "stream"


def labels_complete_at(job: JobSpec, window_end: datetime) -> datetime:
    """When the labels of the held-out hours after a window ending at ``window_end`` are complete: the end
    of those hours plus the largest ``label_delay`` of the :func:`final_labels` sources.

    Example: ``eval_hours: 1`` and a batch ``label_delay: 24h``: a window ending 2026-11-01 10:00 has its
    final labels at 2026-11-02 11:00.
    """
    kind = final_labels(job)
    delay = max((s.label_delay for _, s in job.dataset.all_sources() if s.kind == kind), default=timedelta(0))
    return eval_end(job, window_end) + delay
