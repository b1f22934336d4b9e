"""Data-parallel training: N training processes as one ``torch.distributed`` group (gloo, CPU).

Rank ``r``: a process, its own :class:`RemoteReader` (``trainer_id = r``) on one data plane made with
``trainers=N`` (every sample trained once across the ranks), training with the one
:class:`~primus_dagster.training.loop.PhaseLoop` under the :class:`LockStep` coordinator; a gradient
exchange keeps replicas identical. The training job runs such groups with checkpoints (its rank group);
the tests (``tests/training/rankkit.py``) and the benchmarks (``bench/_ddp.py``) run some without.

* :mod:`.mesh` -- the transport: :class:`PeerMesh` (direct sockets), :class:`GlooBytes` (its gloo
  fallback), both a :class:`ByteAllGather`;
* :mod:`.exchange` -- the gradient exchange: :class:`GradientExchange` (what the coordinator calls),
  :class:`RowSparseExchange` (the one jobs run), :func:`parameter_groups`, the status row's layout;
* :mod:`.lockstep` -- :class:`LockStep`: the phase loop's coordinator of a lock-step group;
* :mod:`.sharded` -- :class:`ShardedExchange`: tables sharded by rows across the ranks (``training.sharding``);
* :mod:`.torchrec_dmp` -- :class:`DMPExchange`: a custom model's TorchRec tables sharded by TorchRec's
  ``DistributedModelParallel`` (``training.sharding: row_wise``);
* :mod:`.launch` -- starting ranks: :class:`RankProcesses`, :func:`serve_rank`, :func:`collect_results`,
  :func:`pin_cores`; how they start is a :class:`RankLauncher` (:class:`SpawnLauncher`: children of this
  process);
* :mod:`.channel` -- :class:`DialBackLauncher`: ranks someone else starts (plain processes, pods) dial
  back to the parent (``python -m primus_dagster.training.distributed.dial_back``, :mod:`.dial_back`).

**Rounds, not** ``Join``. Each optimiser step is a *round*: every rank polls its reader without
waiting and the ranks all-gather ``(ready, ended, kind, n_dense, n_sparse, label sum, label count)``
(with ``row_sparse`` in the same message as the gradients: one exchange a round).
Nobody ready: stop once all ended, else wait briefly and poll again. Otherwise *every* rank steps: a
ready rank trains its micro-batch, the others take a *null step* (no data, zero gradient). ``Join``
covers ranks whose data *ended*, not a rank waiting for data that depends on the others: an executor
blocked on trainer 0's full buffer (forward shuffle) makes no batch for trainer 1, and trainer 0
drains it only while it steps; under ``Join`` it waits in its step's collective for trainer 1 -- a
deadlock (seen at 60k rows/hour in ``tests/training/jobkit``). Rounds also keep the Adam states
identical. The first round in which any rank has data builds the model on every rank with the lowest
ready rank's widths (same seed): a rank without any batch still takes part. The model's label
observations (MTRM's label-delay counts) are added from the gathered label sums of every ready rank, in
rank order, so every replica holds the group's counts. With ``data.deterministic`` every rank waits for
its next batch in the plan's order instead of polling: who holds what each round is fixed by the data.

**Averaging.** Each gradient is averaged over the ranks that trained it in the round, as the model
declares what a kind trains (:meth:`~primus_dagster.training.models.RecModel.parameter_groups`; MTRM:
ranks of kind ``batch`` for the memory tower, ``stream`` for the adapt tower); a group no rank trained
is not sent and keeps ``grad=None`` (Adam skips it); a parameter of a group some rank trained gets the
group's gradient on every rank (zeros from the others). A :class:`GradientExchange` does this; two
exist:

* ``row_sparse`` (:class:`RowSparseExchange`, the default): embedding tables keep sparse gradients; each
  rank coalesces its table gradient to the rows its step touched (once) and sends one message a
  round -- its status row, those rows, the dense gradients of the towers its kind trains -- to every
  other rank over direct sockets (:class:`PeerMesh`; gloo as a fallback across hosts); every rank
  sums the messages in rank order, divides, and hands
  :class:`~primus_dagster.training.trainer.RecOptimizer`'s lazy SparseAdam one *coalesced* sparse
  gradient, as a single trainer does. 1024 x 5 ids touch at most 5120 of 100 000 rows: ~0.17 MB a
  rank a round (measured) instead of the 6.4 MB dense table. A null step sends its status only (no
  forward) and applies the group's gradients.
* ``ddp_dense`` (``bench/_ddp.py``'s ``DenseDDPExchange``, the baseline of ``bench/train_throughput.py``):
  the model in ``DistributedDataParallel`` with dense embedding gradients, a comm hook doing the
  division and all-reducing each trained tower's flat buckets; a null step runs a zero-row forward of
  a kind some ready rank trains (DDP needs its backward).

Example (one rank over a data plane; start ``world`` of them with :class:`RankProcesses`)::

    def rank_main(rank: int, init_method: str, out: Any, plan: Plan) -> None:
        def body() -> RankResult:
            with DriverClient(plan.location) as client, RemoteReader(client, rank) as reader:
                coordinator = LockStep()
                loop = PhaseLoop(plan.context, coordinator, reader, plan.sink(out), checkpoint_every=0)
                loop.run()
                coordinator.close()
            return loop.result()

        serve_rank(rank, plan.world, init_method, 1, out, body)

    with RankProcesses(rank_main, plan.world, plan) as ranks:
        results = collect_results(ranks, timeout_s=600)
    assert len({r.params_checksum for r in results}) == 1     # identical replicas
"""

from primus_dagster.training.distributed.channel import (
    ChannelError,
    ChannelTimeoutError,
    DialBackLauncher,
    ProcessStarter,
)
from primus_dagster.training.distributed.exchange import (
    Divisor,
    GradientExchange,
    RoundMessages,
    RowSparseExchange,
    parameter_groups,
)
from primus_dagster.training.distributed.launch import (
    RankHandle,
    RankLauncher,
    RankProcesses,
    SpawnLauncher,
    collect_results,
    first_failure,
    pin_cores,
    serve_rank,
)
from primus_dagster.training.distributed.lockstep import LockStep
from primus_dagster.training.distributed.mesh import ByteAllGather, GlooBytes, PeerMesh
from primus_dagster.training.distributed.sharded import ShardedExchange, sharded_tables
from primus_dagster.training.distributed.torchrec_dmp import DMPExchange

__all__ = [
    "ByteAllGather",
    "ChannelError",
    "ChannelTimeoutError",
    "DMPExchange",
    "DialBackLauncher",
    "Divisor",
    "GlooBytes",
    "GradientExchange",
    "LockStep",
    "PeerMesh",
    "ProcessStarter",
    "RankHandle",
    "RankLauncher",
    "RankProcesses",
    "RoundMessages",
    "RowSparseExchange",
    "ShardedExchange",
    "SpawnLauncher",
    "collect_results",
    "first_failure",
    "parameter_groups",
    "pin_cores",
    "serve_rank",
    "sharded_tables",
]
