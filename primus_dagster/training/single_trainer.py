"""One trainer in this process: the :class:`~primus_dagster.training.phase_trainer.PhaseTrainer` of a job
with ``pools.training.replicas: 1``.

Each phase it reads trainer 0's batches from the phase's data plane (a prioritised phase: through the
mixture prioritisation, which weighs the executors' buffers too, since the driver is in this process) and
trains them with the :class:`~primus_dagster.training.loop.PhaseLoop` under the
:class:`~primus_dagster.training.loop.Solo` coordinator, its news going straight to the run
(:class:`~primus_dagster.training.loop.RunSink`). The trainer -- model, optimiser, compiled kernels -- lives
on from one phase to the next. A failure here is this process's own: nothing to restart it from.

Example::

    trainer = SingleTrainer(RunHooks())
    result = train_window(request, trainer=trainer)      # what phase_trainer picks for one trainer
"""

from __future__ import annotations

from typing import Any

from primus_dagster.data import DataPlane
from primus_dagster.training.loop import PhaseLoop, RunSink, Solo, TrainerState, phase_context
from primus_dagster.training.models import RecModel
from primus_dagster.training.modes import Phase
from primus_dagster.training.phase_trainer import LoopPhaseTrainer
from primus_dagster.training.run_state import RunHooks, TrainingRun


class SingleTrainer(LoopPhaseTrainer):
    """The one trainer of a window run, in this process (module docstring).

    Example::

        trainer = SingleTrainer(RunHooks(on_batch=audit))
        trainer.train_phase(run, phase, plane)
        model, step = trainer.final_model(run)
    """

    def __init__(self, hooks: RunHooks):
        super().__init__()
        self.hooks = hooks
        self.state = TrainerState()  # lives on across the phases

    def train_phase(self, run: TrainingRun, phase: Phase, plane: DataPlane) -> None:
        context = phase_context(run, phase, world=1)
        chooser = context.mixture(0, backlog_fn=plane.driver.serving_rows_by_kind)
        ordered: dict[str, Any] = {"deterministic": True} if context.deterministic else {}
        sink = RunSink(run, self.hooks, phase, plane, world=1, progress_s=context.progress_s)
        run.stage("phase %s: data executors up; waiting for the first batch", phase.name)
        with plane.reader(0, choose_queue=chooser, **ordered) as reader:
            loop = PhaseLoop(
                context, Solo(), reader, sink, state=self.state, device=run.device, rank_hook=self.hooks.rank_hook
            )
            loop.run()
            loop.finish()
        self.record(sink.last, [loop.result()])

    def in_memory_model(self) -> RecModel | None:
        return self.state.trainer.model if self.state.trainer is not None else None
