"""Rank groups for the tests, started with :mod:`primus_dagster.training.distributed.launch`.

* :func:`run_ddp` -- ``world_size`` ranks over a data plane, each with its own :class:`RemoteReader`
  (``trainer_id = rank``), no checkpoints;
* :func:`run_ddp_in_memory` -- the benchmarks' group without a data plane (``bench/_ddp.py``, also
  the ``ddp_dense`` baseline exchange): ``bench/`` goes on ``sys.path`` here, which the spawned ranks
  inherit, so they import their target as ``_ddp``.

Example::

    with PooledDataPlane(job_path, data_root, tasks, executors=2, trainers=2) as plane:   # any DataPlane
        results = run_ddp(plane, job.training, world_size=2)
    assert len({r.params_checksum for r in results}) == 1     # identical replicas
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from primus_dagster.data import Batch, DataPlane, DriverClient, RemoteReader
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.distributed import LockStep, RankProcesses, collect_results, serve_rank
from primus_dagster.training.loop import PhaseContext, PhaseLoop, ProgressPoint, RankResult, SavedCheckpoint

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from _ddp import run_ddp_in_memory  # noqa: E402 - bench/ on sys.path first

__all__ = ["PlaneRankResult", "expect_address", "fail_at", "kill_at", "run_ddp", "run_ddp_in_memory"]


@dataclass
class PlaneRankResult(RankResult):
    """A rank's result and the sample ids it trained, in order (``record_ids``)."""

    sample_ids: list[int] = field(default_factory=list)


class IdsSink:
    """A rank's sink that keeps the sample ids of the reader batches it trained (and nothing else)."""

    def __init__(self, record: bool):
        self.wants_batches, self.ids = record, list[int]()

    def batch_trained(self, rank: int, step: int, batch: Batch) -> None:
        if batch.sample_id is not None:
            self.ids.extend(int(i) for i in batch.sample_id.tolist())

    def progress(self, point: ProgressPoint) -> None:
        pass

    def checkpoint(self, rank: int, step: int, saved: SavedCheckpoint | None) -> None:
        pass


@dataclass(frozen=True)
class PlanePlan:
    """What every rank of :func:`run_ddp` gets (pickled into the spawned processes)."""

    world_size: int
    driver_location: str
    token: str | None
    training_spec_json: str
    n_threads: int
    record_ids: bool
    kind_weights: dict[str, float] = field(default_factory=dict)
    timeout_s: float = 600.0


def plane_rank(rank: int, init_method: str, out_queue: Any, plan: PlanePlan) -> None:
    """One rank of :func:`run_ddp`: reads trainer ``rank``'s batches from the data plane and trains them
    with the phase loop under the lock-step coordinator, without checkpoints."""

    def body() -> PlaneRankResult:
        spec = TrainingSpec.model_validate_json(plan.training_spec_json)
        context = PhaseContext.outside_run(spec, plan.world_size, kind_weights=plan.kind_weights)
        sink = IdsSink(plan.record_ids)
        with (
            DriverClient(plan.driver_location, token=plan.token) as client,
            RemoteReader(client, rank, token=plan.token, choose_queue=context.mixture(rank)) as reader,
        ):
            coordinator = LockStep(timeout_s=plan.timeout_s)
            loop = PhaseLoop(context, coordinator, reader, sink, checkpoint_every=0)
            loop.run()
            coordinator.close()
        return PlaneRankResult(**vars(loop.result()), sample_ids=sink.ids)

    serve_rank(rank, plan.world_size, init_method, plan.n_threads, out_queue, body, timeout_s=plan.timeout_s)


def run_ddp(
    plane: DataPlane,
    spec: TrainingSpec,
    world_size: int,
    *,
    threads_per_rank: int = 1,
    record_ids: bool = False,
    timeout_s: float = 600,
) -> list[PlaneRankResult]:
    """Train ``spec``'s model on the plane's data with ``world_size`` ranks (``spawn``-ed
    processes, gloo on loopback); results by rank. RuntimeError naming the rank when one fails."""
    if plane.trainers != world_size:
        raise ValueError(f"the data plane serves {plane.trainers} trainers; world_size is {world_size}")
    plan = PlanePlan(
        world_size=world_size,
        driver_location=plane.location,
        token=plane.token,
        training_spec_json=spec.model_dump_json(),
        n_threads=threads_per_rank,
        record_ids=record_ids,
        kind_weights=plane.job.kind_weights(),
        timeout_s=timeout_s,
    )
    with RankProcesses(plane_rank, world_size, plan, name="ddp-rank") as ranks:
        return collect_results(ranks, timeout_s)


def fail_at(rank: int, at_round: int, marker: str | None, this_rank: int, round_: int) -> None:
    """A rank hook (pickled into the ranks): rank ``rank`` raises at ``at_round`` -- once, when
    ``marker`` names a file it creates."""
    if this_rank != rank or round_ != at_round:
        return
    if marker is not None:
        if os.path.exists(marker):
            return
        Path(marker).touch()
    raise RuntimeError(f"injected failure of rank {rank} at round {round_}")


def kill_at(rank: int, at_round: int, this_rank: int, round_: int) -> None:
    """A rank hook: rank ``rank`` SIGKILLs itself at ``at_round`` (no word to anyone, as an OOM kill or a
    lost host leaves it)."""
    if this_rank == rank and round_ == at_round:
        os.kill(os.getpid(), signal.SIGKILL)


def expect_address(rank: int, address: str, this_rank: int, round_: int) -> None:
    """A rank hook: from round 2 on (the peers are connected), rank ``rank`` raises unless its peer
    connections are on ``address`` (the address it was started with; a failed check fails the run)."""
    if this_rank != rank or round_ != 2:
        return
    mine = {c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED}
    if address not in mine:
        raise RuntimeError(f"rank {rank}: no peer connection on {address} (its connections are on {sorted(mine)})")
