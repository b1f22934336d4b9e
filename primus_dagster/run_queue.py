"""The local Dagster instance's run queue and pools: how many runs run at once, sized to the machine's cores.

One stream-sensor tick may ask for a whole training window of Kafka hours (24 runs for a daily
partition) and a batch-sensor tick for every new file partition. Launched at once, each run a Python
process importing Dagster, torch and pyarrow and training ones several more, they load a small
machine far past its cores and the UI stops answering (observed load in docs/scaling.md, "Measured
reasons in the code"). :func:`dagster_home <primus_dagster.paths.dagster_home>`
writes these settings into a new instance's ``dagster.yaml``; the daemon's queued run coordinator then
starts the requested runs in the order they were asked for, at most ``max_concurrent_runs`` at a time:

* ``max_concurrent_runs`` = ``max(2, cores // 2)``: one run's start-up (imports) takes about one core;
  two keep a small machine busy without queueing behind one slow run;
* at most one run of each heavy kind (:data:`RUN_KIND_TAG`): ``training`` (a data driver, executors and
  trainers of their own) and ``live`` (the live model's increments, which must run one after another
  anyway);
* Dagster's concurrency pools at run granularity, one run per pool at a time (``default_limit: 1``): the
  training asset is in the pool ``primus-training-<job>`` and the live model in ``primus-live-<job>``, so a
  run the tag does not cover -- one of Dagster's implicit ``__ASSET_JOB`` that the UI's Materialize dialog
  or a backfill launches -- still waits for the training run in progress instead of training beside it.

The tag is set on the suite's asset jobs (``dagster_defs``); a team's ``dagster.yaml`` (or the
reference Kubernetes deployment's, ``deploy/kubernetes/dagster.yaml``) sets its own limits.

Example::

    run_queue_config(cores=2)
    # {'max_concurrent_runs': 2, 'tag_concurrency_limits': [{'key': 'primus/run_kind', 'value': 'training', 'limit': 1}, ...]}
    concurrency_config(cores=2)   # dagster.yaml's `concurrency:` section: {'runs': {...}, 'pools': {...}}
"""

from __future__ import annotations

import os
from typing import Any

RUN_KIND_TAG = "primus/run_kind"
"""The run tag saying what a run of the suite's jobs does: ``source``, ``training``, ``live`` or ``check``."""

#: The run kinds of which one runs at a time.
ONE_AT_A_TIME = ("training", "live")


def machine_cores() -> int:
    """The cores this process may use (its CPU affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def run_queue_config(cores: int | None = None) -> dict[str, Any]:
    """The ``run_queue`` section of a local instance's ``dagster.yaml`` for a machine of ``cores`` cores."""
    cores = machine_cores() if cores is None else cores
    return {
        "max_concurrent_runs": max(2, cores // 2),
        "tag_concurrency_limits": [{"key": RUN_KIND_TAG, "value": kind, "limit": 1} for kind in ONE_AT_A_TIME],
    }


#: Every pool of the suite's assets (``primus-training-<job>``, ``primus-live-<job>``) runs one run at a time.
POOLS = {"granularity": "run", "default_limit": 1}


def concurrency_config(cores: int | None = None) -> dict[str, Any]:
    """The ``concurrency`` section of a local instance's ``dagster.yaml`` for a machine of ``cores`` cores: the
    run queue (:func:`run_queue_config`) under ``runs`` and the pools (:data:`POOLS`) under ``pools``."""
    return {"runs": run_queue_config(cores), "pools": dict(POOLS)}
