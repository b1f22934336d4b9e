"""The one phase loop of training, for one trainer or a group (docs/training.md, *The phase loop*).

* :mod:`.phase_loop` -- :class:`PhaseLoop`: rounds, build and start, checkpoints, progress;
* :mod:`.coordinator` -- what differs between one trainer and a group: the :class:`Coordinator`
  protocol, the round (:class:`RoundStatus`, :class:`Round`) and :class:`Solo`, the group of one;
* :mod:`.context` -- what every trainer of a phase gets (:class:`PhaseContext`, :func:`phase_context`)
  and counts (:class:`RankCounters`); the checkpoint record (:func:`checkpoint_record`);
* :mod:`.sink` -- where a trainer's news goes (:class:`LoopSink`) and the job process's :class:`RunSink`;
* :mod:`.result` -- what a trainer did (:class:`RankResult`, :func:`params_checksum`).

Example::

    context = phase_context(run, phase, world=1)
    with plane.reader(0, choose_queue=context.mixture(0)) as reader:
        loop = PhaseLoop(context, Solo(), reader, RunSink(run, hooks, phase, plane, world=1))
        loop.run()
        loop.finish()
"""

from primus_dagster.training.loop.context import (
    PROGRESS_EVERY_S,
    PhaseContext,
    RankCounters,
    TrainerStart,
    checkpoint_ranks,
    checkpoint_record,
    phase_context,
)
from primus_dagster.training.loop.coordinator import Coordinator, Round, RoundStatus, Solo, TableShards
from primus_dagster.training.loop.phase_loop import PhaseLoop, PhaseReader, TrainerState
from primus_dagster.training.loop.result import RankResult, params_checksum
from primus_dagster.training.loop.sink import LoopSink, ProgressPoint, RunSink, SavedCheckpoint

__all__ = [
    "PROGRESS_EVERY_S",
    "Coordinator",
    "LoopSink",
    "PhaseContext",
    "PhaseLoop",
    "PhaseReader",
    "ProgressPoint",
    "RankCounters",
    "RankResult",
    "Round",
    "RoundStatus",
    "RunSink",
    "SavedCheckpoint",
    "Solo",
    "TableShards",
    "TrainerStart",
    "TrainerState",
    "checkpoint_ranks",
    "checkpoint_record",
    "params_checksum",
    "phase_context",
]
