"""Which :class:`~primus_dagster.training.phase_trainer.PhaseTrainer` trains a job: :func:`phase_trainer`.

Example::

    trainer = phase_trainer(job, RunHooks())      # one trainer here, or a group of pools.training.replicas
"""

from __future__ import annotations

from primus_dagster.spec import JobSpec
from primus_dagster.training.phase_trainer import PhaseTrainer
from primus_dagster.training.rank_group import RankGroup
from primus_dagster.training.run_state import RunHooks
from primus_dagster.training.single_trainer import SingleTrainer


def phase_trainer(job: JobSpec, hooks: RunHooks) -> PhaseTrainer:
    """The trainer of ``job``'s runs: a :class:`~primus_dagster.training.rank_group.RankGroup` of
    ``pools.training.replicas`` rank processes when that is more than one, else one trainer in this process."""
    replicas = job.pools.training.replicas
    return RankGroup(hooks, replicas) if replicas > 1 else SingleTrainer(hooks)
