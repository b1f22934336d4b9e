"""The one training loop of a phase, for one trainer or a group: :class:`PhaseLoop`.

Every trainer of a window run -- the one trainer in the job's process, or each rank of a group in a process
of its own -- trains a phase with this loop; what differs is its
:class:`~primus_dagster.training.loop.coordinator.Coordinator` (docs/training.md, *The phase loop*).

* **Rounds.** Each round the trainer takes its next micro-batch -- ``batch_size`` rows of consecutive
  reader batches of one kind (:class:`~primus_dagster.training.coalesce.BatchCoalescer`), shorter only when
  flushed: at a checkpoint, at the end of the data, or when the coordinator does not wait for the reader
  and it has nothing ready -- and the coordinator makes the group's round of every trainer's status. If
  any trainer holds data, every trainer steps: with its micro-batch (backward, the group's gradients, the
  optimiser), or a null step. ``step`` is the round count, the same on every trainer. The model observes
  the labels of every ready trainer's micro-batch, in rank order (MTRM's label-delay calibration), so every
  replica holds the group's counts.
* **Build.** The model is built at the first round in which some trainer has data, on the run's feature
  layout (:class:`~primus_dagster.training.features.ModelInit`, the same seed on every trainer), then the
  start is applied: a resume (model, optimizer, this rank's counters, the round count) or a warm start (a
  finished run's model and optimizer). A group with sharded tables builds on every trainer before its
  first round instead: the build and the start are collectives there, and a trainer holding data must
  not enter one while the others wait in the round's agreement.
* **Checkpoints.** Once ``checkpoint_every_steps`` rounds have passed, the trainers stop pulling and finish
  the rows they hold; at the first round in which none holds any (the same round on every trainer) every
  trainer reports its consumed batches at the driver's barrier, the counters are gathered, and rank 0 saves
  model, optimizer, the barrier snapshot and every rank's counters
  (:func:`~primus_dagster.training.loop.context.checkpoint_record`): a checkpoint covers whole reader
  batches of every trainer. :meth:`PhaseLoop.finish` closes the phase with one that says so.
* **Progress and audits.** A progress point every ``progress_s``, and each reader batch trained whole, go
  to the loop's :class:`~primus_dagster.training.loop.sink.LoopSink`.
* ``data.deterministic``: the loop waits for its reader's next batch in the plan's order, whatever the
  coordinator would do, so the rounds -- who holds what, every micro-batch's rows -- depend on the data and
  the seed alone.

Example::

    loop = PhaseLoop(context, Solo(), reader, RunSink(run, hooks, phase, plane, world=1))
    loop.run()
    loop.finish()
    loop.state.trainer.model
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from primus_dagster.data import Batch
from primus_dagster.training.checkpoint import checkpoint_name, load_checkpoint, load_weights, save_checkpoint
from primus_dagster.training.coalesce import BatchCoalescer, MicroBatch
from primus_dagster.training.features import FeatureLayout, ModelInit
from primus_dagster.training.loop.context import PhaseContext, RankCounters, checkpoint_record
from primus_dagster.training.loop.coordinator import Coordinator, Round, RoundStatus
from primus_dagster.training.loop.result import RankResult, params_checksum
from primus_dagster.training.loop.sink import LoopSink, ProgressPoint, SavedCheckpoint
from primus_dagster.training.run_state import RankHook
from primus_dagster.training.trainer import Trainer, TrainerStats

log = logging.getLogger(__name__)


class PhaseReader(Protocol):
    """Where a trainer's reader batches come from (a :class:`~primus_dagster.data.RemoteReader`)."""

    def next_batch(self, kind: str | None = None, timeout: float | None = None) -> Batch | None:
        """The next batch; None once the data ended; TimeoutError after ``timeout`` seconds without one."""
        ...

    def barrier(self, barrier_id: int, wait_s: float = 0.0) -> dict[str, Any] | None:
        """Report the consumed batches at ``barrier_id``; the driver's snapshot once every trainer did."""
        ...


@dataclass
class TrainerState:
    """This process's trainer and its place in the group's rounds; one trainer keeps it across the phases
    of a run (its model, optimiser and compiled kernels live on), a trainer process per phase."""

    trainer: Trainer | None = None
    rounds: int = 0
    null_steps: int = 0


class PhaseLoop:
    """One trainer's loop over one phase (module docstring). ``checkpoint_every``: rounds between
    checkpoints (None: ``training.checkpoint_every_steps``; 0: none, e.g. a benchmark);
    ``rank_hook(rank, round)``: called before every round (fault injection)."""

    def __init__(
        self,
        context: PhaseContext,
        coordinator: Coordinator,
        reader: PhaseReader,
        sink: LoopSink,
        *,
        state: TrainerState | None = None,
        device: torch.device | None = None,
        rank_hook: RankHook | None = None,
        checkpoint_every: int | None = None,
    ):
        self.context, self.spec = context, context.spec
        self.coordinator, self.reader, self.sink = coordinator, reader, sink
        self.rank = coordinator.rank
        self.device = device if device is not None else torch.device("cpu")
        self.rank_hook = rank_hook
        fresh = state is None or state.trainer is None
        self.state = state if state is not None else TrainerState()
        start = context.start
        if fresh and start is not None and start.kind == "resume":
            self.state.rounds = start.step
        # reader batches trained in this phase (a deterministic mixture replays as many draws on resume)
        self.batches = context.start_counters(self.rank).batches if fresh else 0
        self.every = self.spec.checkpoint_every_steps if checkpoint_every is None else checkpoint_every
        self.next_checkpoint = self.state.rounds + self.every
        self.pending: deque[MicroBatch] = deque()
        self.coalescer = BatchCoalescer(self.spec.batch_size)
        self.ended = False
        self.widths = (0, 0)  # of the model's inputs (dense, ids), once it is built
        if self.state.trainer is not None:
            self.widths = (self.state.trainer.model.n_dense, self.state.trainer.model.n_sparse)
        # (round, loss) since the last progress point (bounded: a loop without progress points keeps the last)
        self.losses: deque[tuple[int, float]] = deque(maxlen=100_000)
        self.samples0, self.train_s0 = 0, 0.0  # the trainer's counters when this loop took it (or built it)
        if self.state.trainer is not None:
            self.samples0, self.train_s0 = self.state.trainer.counters.samples, self.state.trainer.counters.train_s
        self.rounds0 = self.state.rounds
        self._last_progress = 0.0  # the first round reports at once (the run log's "training" stage)
        self._started, self._cpu0 = time.perf_counter(), time.process_time()

    # -------------------------------------------------------------------------------------------- rounds
    def run(self, max_rounds: int | None = None) -> None:
        """Rounds until every trainer's data ended (or ``max_rounds`` rounds with data)."""
        idle, done = False, 0
        if self.state.trainer is None and self.coordinator.table_shards is not None:
            self._build_collectively()
        while max_rounds is None or done < max_rounds:
            self.coordinator.before_round(self.state.rounds)
            if self.rank_hook is not None:
                self.rank_hook(self.rank, self.state.rounds)
            draining = self._checkpoint_due()
            wait_s = None if self.context.deterministic else self.coordinator.poll_s(idle)
            head = self._head(wait_s, pull=not draining)
            trainer, loss, started = self.state.trainer, None, time.perf_counter()
            status = RoundStatus.of(head, self.ended)
            if head is not None:
                trainer = self._trainer(status.widths)
                if self.coordinator.backward_first:  # its gradients ride with its status
                    loss = trainer.backward(head)
            round = self.coordinator.agree(status, trainer, head)
            if not round.ready:
                if draining and not round.all_ended:
                    self.checkpoint(phase_done=False)  # every trainer, this round: nobody holds a reader batch
                    continue
                if round.all_ended:
                    return
                idle = True  # nobody had data: every trainer waits for some a little (coordinator.poll_s)
                continue
            idle, done = False, done + 1
            self.state.rounds += 1
            trainer = self._trainer(round.widths)
            self._observe(trainer, round)
            if head is None:
                self._null_step(trainer, round)
            else:
                self._step(trainer, loss, started, round)
            self._report()

    def _step(self, trainer: Trainer, loss: torch.Tensor | None, started: float, round: Round) -> None:
        popped = self.pending.popleft()
        if loss is None:  # the coordinator runs the backward (e.g. an exchange inside it)
            started = time.perf_counter()
        loss = self.coordinator.gradients(trainer, popped.batch, loss, round)
        self.losses.append((self.state.rounds, trainer.apply(popped.batch, loss, started)))
        if self.sink.wants_batches:
            for finished in popped.finished:
                self.sink.batch_trained(self.rank, self.state.rounds, finished)

    def _null_step(self, trainer: Trainer, round: Round) -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        self.coordinator.null_gradients(trainer, round)
        trainer.optimizer.step()
        self.state.null_steps += 1

    def _observe(self, trainer: Trainer, round: Round) -> None:
        """Every ready trainer's label sum and count, in rank order, and the widths they all share."""
        if {s.widths for s in round.ready} != {self.widths}:
            widths = sorted({s.widths for s in round.ready})
            raise ValueError(f"batches of input widths {widths}; the model's: {self.widths}")
        for status in round.ready:
            trainer.model.observe_labels(status.kind, status.label_sum, status.rows)

    def _checkpoint_due(self) -> bool:
        return self.every > 0 and self.state.rounds >= self.next_checkpoint

    def _head(self, wait_s: float | None, pull: bool) -> Batch | None:
        """This trainer's micro-batch of the round: reader batches are pulled (``pull``) until one of
        ``batch_size`` rows is full; when the data ends, none is ready within ``wait_s`` or pulling stops
        (a checkpoint drain), the open one is flushed, however short. None: it holds no rows."""
        while not self.pending and not self.ended and pull:
            try:
                batch = self.reader.next_batch(timeout=wait_s)
            except TimeoutError:
                break
            if batch is None:
                self.ended = True
                break
            self.batches += 1
            if self.context.init is not None:  # the run's layout: every reader batch carries its columns
                self.context.init.layout.check(batch)
            self.pending.extend(self.coalescer.add(batch))
        if not self.pending:
            self.pending.extend(self.coalescer.flush())
        return self.pending[0].batch if self.pending else None

    # ----------------------------------------------------------------------------- build and start
    def _trainer(self, widths: tuple[int, int]) -> Trainer:
        """The trainer, built on the first call (on the run's layout; these widths without one) with the
        start applied (module docstring)."""
        if self.state.trainer is not None:
            return self.state.trainer
        init = self.context.init or ModelInit(FeatureLayout.plain(self.spec.model, *widths))
        if (init.layout.n_dense, init.layout.n_sparse) != widths:
            raise ValueError(
                f"batches of input widths {widths}; the model's layout: {(init.layout.n_dense, init.layout.n_sparse)}"
            )
        trainer = self.coordinator.build(self.spec, init, device=self.device, deterministic=self.context.deterministic)
        self._apply_start(trainer)
        log.info("kernels: %s", trainer.kernels.describe())
        self.state.trainer, self.widths = trainer, widths
        self.samples0, self.train_s0 = trainer.counters.samples, trainer.counters.train_s
        return trainer

    def _build_collectively(self) -> None:
        """The trainer of a group with sharded tables, built on every rank at the same point (module docstring)."""
        init = self.context.init
        if init is None:
            raise ValueError("a group with sharded tables needs the run's feature layout before its first round")
        self._trainer((init.layout.n_dense, init.layout.n_sparse))

    def _apply_start(self, trainer: Trainer) -> None:
        start = self.context.start
        if start is None:
            return
        shards = self.coordinator.table_shards
        checkpoint = load_checkpoint(start.path, merge_shards=shards is None)
        if shards is not None:  # this rank's rows (a collective when the checkpoint has shards)
            checkpoint = shards.localize(trainer, checkpoint, Path(start.path))
        load_weights(
            trainer.model, trainer.optimizer, checkpoint, warm_key=start.warm_key if start.kind == "warm" else None
        )
        if start.kind == "resume":
            mine = self.context.start_counters(self.rank)
            trainer.counters = TrainerStats(
                step=mine.steps, samples=mine.samples, samples_by_kind=dict(mine.samples_by_kind)
            )
            self.state.null_steps = mine.null_steps

    # ------------------------------------------------------------------------------------ checkpoints
    def checkpoint(self, *, phase_done: bool) -> None:
        """Collective: every trainer at the same round (module docstring). Rank 0 saves and tells the sink
        what it saved; the others tell it their batches up to here were handed over."""
        rounds = self.state.rounds
        snapshot = self.reader.barrier(rounds, wait_s=self.coordinator.barrier_wait_s)
        ranks = self.coordinator.gather(self.counters())
        trainer, saved = self.state.trainer, None
        shards, sharded = self.coordinator.table_shards, None
        staging = Path(self.context.checkpoint_dir) / f".shards-{checkpoint_name(rounds)}"
        if shards is not None and trainer is not None:  # every rank writes its rows (a collective)
            sharded = shards.save(trainer, staging)
        if self.rank == 0 and trainer is not None:
            if snapshot is None and not phase_done:  # without the data progress a restore would replay samples
                log.warning("no driver barrier snapshot at round %d: checkpoint skipped", rounds)
                shutil.rmtree(staging, ignore_errors=True)
            else:
                record = checkpoint_record(
                    self.context, trainer, rounds, ranks, snapshot, phase_done=phase_done, sharded=sharded
                )
                directory = save_checkpoint(
                    record,
                    Path(self.context.checkpoint_dir) / checkpoint_name(rounds),
                    shards=staging if sharded is not None else None,
                )
                saved = SavedCheckpoint(
                    rounds,
                    str(directory),
                    self.context.phase,
                    phase_done,
                    record.samples,
                    len(ranks),
                    tuple(r.to_dict() for r in ranks),
                    dict(record.extra["stats"]),
                )
        self.sink.checkpoint(self.rank, rounds, saved)
        self.next_checkpoint = rounds + self.every

    def finish(self) -> None:
        """The end of the phase: its last progress point and the checkpoint that closes it (the model
        built from the start checkpoint when no batch came, so that checkpoint still says it is done)."""
        if self.state.trainer is None and self.context.start is not None:
            layout = self.context.init.layout if self.context.init is not None else None
            if layout is not None:
                self._trainer((layout.n_dense, layout.n_sparse))
        self._report(force=True)
        self.checkpoint(phase_done=True)

    def counters(self) -> RankCounters:
        """This trainer's counters now (what a checkpoint keeps of it)."""
        trainer = self.state.trainer
        c = trainer.counters if trainer is not None else TrainerStats()
        return RankCounters(c.step, c.samples, dict(c.samples_by_kind), self.state.null_steps, self.batches)

    # ---------------------------------------------------------------------------------- progress
    def _report(self, force: bool = False) -> None:
        trainer, now = self.state.trainer, time.monotonic()
        if trainer is None or (not force and now - self._last_progress < self.context.progress_s):
            return
        self._last_progress = now
        losses = tuple(self.losses)
        self.losses.clear()
        stats = trainer.stats()
        c = trainer.counters
        point = ProgressPoint(
            self.rank,
            self.state.rounds,
            c.samples,
            float(stats["samples_per_s"]),
            c.loss_ema,
            trainer.recent_auc(),
            losses,
        )
        self.sink.progress(point)

    def result(self) -> RankResult:
        """What this trainer did (its counters, the samples this loop trained, its time, a checksum)."""
        wall_s, cpu_s = time.perf_counter() - self._started, time.process_time() - self._cpu0  # the checksum apart
        trainer = self.state.trainer
        c = trainer.counters if trainer is not None else TrainerStats()
        checksum, abs_sum = params_checksum(trainer.model) if trainer is not None else ("", 0.0)
        return RankResult(
            rank=self.rank,
            steps=c.step,
            samples=c.samples,
            samples_by_kind=dict(c.samples_by_kind),
            wall_s=round(wall_s, 3),
            train_s=round(c.train_s - self.train_s0, 3),
            params_checksum=checksum,
            params_abs_sum=abs_sum,
            null_steps=self.state.null_steps,
            cpu_s=round(cpu_s, 3),
            samples_trained=c.samples - self.samples0,
            loss=c.loss_ema,
            extra=self.coordinator.describe(self.state.rounds - self.rounds0),
        )
