"""What the training job refuses up front, with a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobkit import make_job

from primus_dagster.training.job import TrainingJob, run_training_job


def test_more_than_one_trainer_is_refused_by_the_training_job_not_ignored(tmp_path: Path) -> None:
    env = make_job(tmp_path, hours=0)
    job = env["job"].model_copy(
        update={
            "pools": env["job"].pools.model_copy(
                update={"training": env["job"].pools.training.model_copy(update={"replicas": 2, "max_replicas": 2})}
            )
        }
    )
    with pytest.raises(ValueError, match=r"pools.training.replicas: 2"):
        run_training_job(TrainingJob(job, env["job_path"], tmp_path, env["window"]))
