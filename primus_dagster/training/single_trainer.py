"""One trainer in this process: the :class:`~primus_dagster.training.window.PhaseTrainer` of a job with
``pools.training.replicas: 1``.

It reads trainer 0's batches from the phase's data plane (``mixed``: the mixture prioritisation picks
the queue), builds the model at the first batch (its input widths come from the data) and applies the
resumed checkpoint or the warm start to it, trains the rows of consecutive reader batches of a kind
in micro-batches of ``batch_size`` (:class:`~primus_dagster.training.coalesce.BatchCoalescer`: many
small files make full steps), and every ``checkpoint_every_steps`` steps trains the rows it holds (a
flush), asks the reader for its consumed batches at a driver barrier and checkpoints model,
optimizer, counters, the barrier snapshot and the source versions: a checkpoint covers exactly the
reader batches trained. ``RunHooks.on_batch`` hears of each reader batch once all its rows are
trained. A phase ends with a flush and a checkpoint that says so.

Example::

    trainer = SingleTrainer(RunHooks())
    result = train_window(request, trainer=trainer)      # what train_window picks for one trainer
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from primus_dagster.data import ChooseQueue, DataPlane
from primus_dagster.training.checkpoint import Checkpoint, load_weights, save_checkpoint, trainer_checkpoint
from primus_dagster.training.coalesce import BatchCoalescer, MicroBatch
from primus_dagster.training.models import RecModel, build_initial_model, model_summary
from primus_dagster.training.modes import Phase
from primus_dagster.training.planning import NoTrainingDataError
from primus_dagster.training.priority import MixturePriority
from primus_dagster.training.run_state import RunHooks, TrainingRun
from primus_dagster.training.trainer import Trainer

log = logging.getLogger(__name__)

#: Seconds between two progress points (MLflow metrics, the progress line).
PROGRESS_EVERY_S = 2.0


class SingleTrainer:
    """The one trainer of a window run, in this process (module docstring).

    Example::

        trainer = SingleTrainer(RunHooks(on_batch=audit))
        trainer.begin(run, resume=None)
        trainer.train_phase(run, phase, plane)
        trainer.end_phase(run, phase)
        model, step = trainer.final_model(run)
    """

    trainers = 1
    restartable = False  # a failure here is this process's own: nothing to restart it from

    def __init__(self, hooks: RunHooks):
        self.hooks = hooks
        self.trainer: Trainer | None = None
        self.resume: Checkpoint | None = None  # applied when the model exists
        self.next_checkpoint = 0
        self._last_progress = 0.0

    def describe(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {}, {}

    def begin(self, run: TrainingRun, resume: Checkpoint | None) -> None:
        self.resume = resume
        self.next_checkpoint = (resume.step if resume is not None else 0) + run.spec.checkpoint_every_steps

    def build(self, run: TrainingRun) -> Trainer:
        """The trainer (built once, at the first batch, on ``run.model_init``), with the resumed
        checkpoint or the warm start applied."""
        if self.trainer is not None:
            return self.trainer
        spec = run.spec
        if run.model_init is None:
            raise RuntimeError("the run's model layout was not resolved before training (train_window sets it)")
        model = build_initial_model(spec.model, run.model_init, seed=spec.seed)
        trainer = Trainer(model, spec, device=run.device, deterministic=run.job.data.deterministic)
        run.tracker.set_tags({"primus.model": str(model_summary(trainer.model))})
        log.info("kernels: %s", trainer.kernels.describe())
        if self.resume is not None:
            ck = self.resume
            trainer.restore(
                ck.model_state,
                ck.optimizer_state,
                step=ck.step,
                samples=ck.samples,
                samples_by_kind=ck.extra.get("samples_by_kind"),
            )
        elif run.warm is not None:
            load_weights(trainer.model, trainer.optimizer, run.warm, warm_key=run.request.warm_start)
        self.trainer = trainer
        return trainer

    def train_phase(self, run: TrainingRun, phase: Phase, plane: DataPlane) -> None:
        spec = run.spec
        # Both kinds live: q_i weighs the serving buffers (rows per kind at the executors and in the
        # reader queue); it steers what the reader serves (the driver's loading policy, what it leases).
        # data.deterministic: the plan's order, and kinds drawn from the seed and w_i alone -- replayed up
        # to the batches a resumed phase's driver says were trained (one draw each).
        deterministic = run.job.data.deterministic
        chooser: ChooseQueue | None = None
        if phase.prioritised and deterministic:
            mixture = MixturePriority(run.job.kind_weights(), seed=spec.seed, deterministic=True)
            mixture.skip(int(plane.driver.status().get("consumed_batches", 0)))
            chooser = mixture
        elif phase.prioritised:
            chooser = MixturePriority(
                run.job.kind_weights(), seed=spec.seed, backlog_fn=plane.driver.serving_rows_by_kind, queue_rows=True
            )
        ordered: dict[str, Any] = {"deterministic": True} if deterministic else {}
        run.stage("phase %s: data executors up; waiting for the first batch", phase.name)
        phase_started, first_batch = time.monotonic(), True
        coalescer = BatchCoalescer(spec.batch_size)
        with plane.reader(0, choose_queue=chooser, **ordered) as reader:
            for batch in reader:
                if first_batch:
                    first_batch = False
                    waited = time.monotonic() - phase_started
                    run.stage("phase %s: training (first batch after %.1f s)", phase.name, waited)
                trainer = self.build(run)
                trainer.model.layout.check(batch)
                self._train(trainer, coalescer.add(batch))
                self._report(run, phase)
                if trainer.step >= self.next_checkpoint:
                    # the barrier reports every batch the reader handed out: their rows all trained first
                    self._train(trainer, coalescer.flush())
                    run.stage("phase %s: step %d: checkpoint barrier, save, upload", phase.name, trainer.step)
                    snapshot = reader.barrier(trainer.step, wait_s=30)
                    if snapshot is None:  # without the data progress a restore would replay trained samples
                        log.warning("no barrier snapshot at step %d: checkpoint skipped", trainer.step)
                        self.next_checkpoint = trainer.step + spec.checkpoint_every_steps
                    else:
                        self._checkpoint(run, phase, snapshot, phase_done=False)
            if self.trainer is not None:
                self._train(self.trainer, coalescer.flush())

    def _train(self, trainer: Trainer, micros: Iterable[MicroBatch]) -> None:
        """One step per micro-batch; then each reader batch it finished to ``hooks.on_batch``."""
        for micro in micros:
            trainer.train_micro(micro.batch)
            if self.hooks.on_batch is not None:
                for batch in micro.finished:
                    self.hooks.on_batch(trainer.step, batch)

    def end_phase(self, run: TrainingRun, phase: Phase) -> None:
        self._report(run, phase, force=True)
        run.stage("phase %s: all data read; final checkpoint of the phase", phase.name)
        self._checkpoint(run, phase, None, phase_done=True)

    @property
    def step(self) -> int:
        return self.trainer.step if self.trainer is not None else 0

    def final_model(self, run: TrainingRun) -> tuple[RecModel, int]:
        if self.trainer is None and self.resume is not None:  # everything was done before the restart
            self.build(run)
        if self.trainer is None:
            raise NoTrainingDataError(f"job {run.job.name}: the window {run.request.window} produced no batches")
        return self.trainer.model, self.trainer.step

    def stats(self, run: TrainingRun) -> dict[str, Any]:
        assert self.trainer is not None  # final_model came first
        return self.trainer.stats()

    def _checkpoint(self, run: TrainingRun, phase: Phase, snapshot: dict[str, Any] | None, *, phase_done: bool) -> None:
        trainer = self.trainer
        if trainer is None:
            return
        window = run.request.window
        ck = trainer_checkpoint(
            *trainer.state(),
            step=trainer.step,
            samples=trainer.counters.samples,
            samples_by_kind=trainer.counters.samples_by_kind,
            phase=phase.name,
            phase_done=phase_done,
            snapshot=snapshot,
            versions=run.versions,
            mode=run.spec.mode,
            window=[window.start.isoformat(), window.end.isoformat()],
            layout=trainer.model.layout,
            stats=trainer.stats(),
            # the finished phases' quality counts (the current phase's are in its driver snapshot)
            data_quality=run.data_quality,
            data_quality_places=run.quality_places,
        )
        directory = save_checkpoint(ck, run.workdir / "checkpoint")
        run.log_checkpoint(directory, trainer.step, phase.name, phase_done=phase_done, what=f"{ck.samples} samples")
        self.next_checkpoint = trainer.step + run.spec.checkpoint_every_steps

    def _report(self, run: TrainingRun, phase: Phase, force: bool = False) -> None:
        now = time.monotonic()
        if self.trainer is None or (not force and now - self._last_progress < PROGRESS_EVERY_S):
            return
        self._last_progress = now
        stats = self.trainer.stats()
        # Every step's loss (sent in one batch every 2 s), the slower-moving figures at the current step.
        losses, self.trainer.step_losses = self.trainer.step_losses, []
        run.tracker.log_metric_points([("loss", loss, step) for step, loss in losses])
        metrics = {
            "samples_per_s": stats["samples_per_s"],
            "samples": stats["samples"],
            "train_auc": self.trainer.recent_auc(),
        }
        run.publish_progress(phase.name, self.trainer.step, metrics, stats)
