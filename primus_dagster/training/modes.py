"""Training modes as phases: which kinds of data a phase trains on, in which order.

==================  =============================================================
``batch``           one phase over the batch streams' tasks
``stream``          one phase over the stream tasks
``batch_then_stream`` pre-train on the batch window, then follow the stream
``mixed``           one phase over both; the reader's mixture prioritisation picks
==================  =============================================================

The table is the spec's :data:`~primus_dagster.spec.MODE_PHASES`, which the one input rule
(:mod:`primus_dagster.spec.inputs`) also reads the kinds of a mode from; this module makes its rows
:class:`Phase` objects. A phase runs its own set of data tasks through the driver; a checkpoint
records the phase it was taken in, so a restart resumes the right phase with the driver's snapshot.

Example::

    for phase in phases("batch_then_stream"):
        tasks = phase_tasks(all_tasks, phase)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from primus_dagster.data import DataTask
from primus_dagster.spec import MODE_PHASES, mode_phases


@dataclass(frozen=True)
class Phase:
    """One stretch of training over the tasks of ``kinds``; ``prioritised``: both queues are live
    and the mixture prioritisation chooses between them."""

    name: str
    kinds: tuple[str, ...]

    @property
    def prioritised(self) -> bool:
        return len(self.kinds) > 1


_PHASES: dict[str, tuple[Phase, ...]] = {
    mode: tuple(Phase(name, kinds) for name, kinds in table) for mode, table in MODE_PHASES.items()
}


def phases(mode: str) -> tuple[Phase, ...]:
    """The phases of a training mode, in order (ValueError naming the modes for an unknown one)."""
    mode_phases(mode)  # the spec's table: an unknown mode is its error
    return _PHASES[mode]


def phase_index(mode: str, name: str) -> int:
    """Position of phase ``name`` in ``mode`` (for resuming from a checkpoint)."""
    names = [p.name for p in phases(mode)]
    if name not in names:
        raise ValueError(
            f"checkpoint phase {name!r} is not a phase of mode {mode!r} ({names}); "
            "was the job's training.mode changed since the checkpoint?"
        )
    return names.index(name)


def phase_tasks(tasks: Iterable[DataTask], phase: Phase) -> list[DataTask]:
    """The tasks a phase trains on (planner order kept)."""
    return [t for t in tasks if t.kind in phase.kinds]
