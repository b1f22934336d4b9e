"""Data-parallel training: N training processes as one ``torch.distributed`` group (gloo, CPU).

Rank ``r``: a process, its own :class:`RemoteReader` (``trainer_id = r``) on one data plane made with
``trainers=N`` (every sample trained once across the ranks); a gradient exchange keeps replicas
identical. The training job runs such groups with checkpoints (``multi_trainer.py``); :func:`run_ddp`
and :func:`run_ddp_in_memory` run one without (tests, benchmarks).

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
ready rank's widths (same seed): a rank without any batch still takes part. MTRM's label-delay
counts are added from the gathered label sums of every ready rank, in rank order, so every replica
holds the group's counts.

**Averaging, MTRM.** Each gradient is averaged over the ranks that trained it in the round
(MTRM: ranks of kind ``batch`` for the memory tower, ``stream`` for the adapt tower); a
tower no rank trained is not sent and keeps ``grad=None`` (Adam skips it); a parameter of a tower
some rank trained gets the group's gradient on every rank (zeros from the others). The stream loss
gives the memory tower no gradient (``MTRM.memory_state`` is detached). Two exchanges do this:

* ``row_sparse`` (default, :class:`RowSparseExchange`): embedding tables keep sparse gradients; each
  rank coalesces its table gradient to the rows its step touched (once) and sends one message a
  round -- its status row, those rows, the dense gradients of the towers its kind trains -- to every
  other rank over direct sockets (:class:`PeerMesh`; gloo as a fallback across hosts); every rank
  sums the messages in rank order, divides, and hands
  :class:`~primus_dagster.training.trainer.RecOptimizer`'s lazy SparseAdam one *coalesced* sparse
  gradient, as a single trainer does. 1024 x 5 ids touch at most 5120 of 100 000 rows: ~0.17 MB a
  rank a round (measured) instead of the 6.4 MB dense table. A null step sends its status only (no
  forward) and applies the group's gradients.
* ``ddp_dense``: the model in ``DistributedDataParallel`` with dense embedding gradients, a comm hook
  (:func:`_average_hook`) doing the division and all-reducing each trained tower's flat buckets; a
  null step runs a zero-row forward of a kind some ready rank trains (DDP needs its backward).
  Kept as the baseline of ``bench/train_throughput.py``.

Example::

    with DirectDataPlane(job_path, data_root, tasks, executors=2, trainers=2) as plane:
        results = run_ddp(plane, job.training, world_size=2)
    assert len({r.params_checksum for r in results}) == 1     # identical replicas
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import pickle
import queue as queue_mod
import secrets
import selectors
import socket
import struct
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from primus_dagster.data import Batch, DirectDataPlane, DriverClient, RemoteReader
from primus_dagster.ports import free_port
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.models import MTRM, build_model, model_inputs
from primus_dagster.training.priority import MixturePriority
from primus_dagster.training.trainer import Trainer, TrainerStats, _coalesced_rows

Exchange = Literal["row_sparse", "ddp_dense"]
_KINDS = ("batch", "stream")
# a round's status row: ready, ended, kind, n_dense, n_sparse, label sum, rows; then rows touched per table
_STATUS, _MAX_TABLES = 7, 8
_HEADER_BYTES = 8 * (_STATUS + _MAX_TABLES)  # the status row at the head of a round's message (float64)


@dataclass
class RankResult:
    """What one rank did: counters, its time, a checksum of its final parameters."""

    rank: int
    steps: int
    samples: int
    samples_by_kind: dict[str, int]
    wall_s: float  # after init_process_group, to the end of training
    train_s: float  # inside its own optimiser steps (null steps excluded)
    params_checksum: str  # sha256 of the concatenated float32 parameter bytes ("" without a model)
    params_abs_sum: float  # float64 sum of |p|
    null_steps: int = 0  # rounds this rank took part in without data of its own
    cpu_s: float = 0.0  # CPU seconds of this process in the measured loop (all its threads)
    sample_ids: list[int] | None = None  # trained sample ids in order (record_ids=True)
    extra: dict[str, float] = field(default_factory=dict)


def params_checksum(model: nn.Module) -> tuple[str, float]:
    """(sha256 of the float32 parameter bytes in order, float64 sum of their absolute values)."""
    flat = [p.detach().to(torch.float32).contiguous() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in flat)).hexdigest()
    return digest, float(sum(float(t.abs().sum(dtype=torch.float64)) for t in flat))


def parameter_groups(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> group`` whose gradients are averaged together: MTRM's ``memory`` /
    ``adapt`` towers, ``all`` for other models."""
    mtrm = isinstance(model, MTRM)
    return {id(p): (name.split(".")[0] if mtrm else "all") for name, p in model.named_parameters()}


class PeerMesh:
    """All-gather of byte messages of any length over direct TCP connections between the ranks of the
    default group (ranks on one host; :meth:`connect` falls back to :class:`GlooBytes` otherwise).

    Why not gloo: a gloo collective hands the work to its own threads (the caller's, a worker's, the
    TCP loop's) and costs ~0.5-1 ms of CPU per call on this 2-core VM whatever its size (measured:
    64 bytes or 160 kB alike), and its buffers have one size for all, so a round needed a status
    all-gather, then the payload padded to the longest. Here the calling thread sends its frame
    (8-byte length + message) to every peer and reads theirs, non-blocking, in one ``select`` loop:
    one exchange per round, nothing padded, no other thread (~0.05 ms of CPU). Setup: every rank
    listens on loopback, the ports and rank 0's random token go round in one gloo all-gather, rank ``r``
    connects to the lower ranks and accepts the higher ones (which must present the token). A peer
    that exits closes its sockets: the others raise ConnectionError naming it; no message within
    ``timeout_s``: TimeoutError.

    Example::

        mesh = PeerMesh.connect(timeout_s=300)          # every rank, after init_process_group
        messages = mesh.all_gather(torch.tensor([1, 2, 3], dtype=torch.uint8))   # in rank order
    """

    def __init__(self, socks: Mapping[int, socket.socket], rank: int, timeout_s: float):
        self.socks, self.rank, self.timeout_s = dict(socks), rank, timeout_s
        self._selector = selectors.DefaultSelector()
        for sock in self.socks.values():
            sock.setblocking(False)

    @staticmethod
    def connect(timeout_s: float, *, same_host: bool | None = None) -> PeerMesh | GlooBytes:
        """Connect every rank of the default group to every other (collective); ``same_host=False``
        forces the gloo fallback (tests)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        with socket.create_server(("127.0.0.1", 0), backlog=max(1, world)) as listener:
            listener.settimeout(timeout_s)
            info: list[Any] = [None] * world
            dist.all_gather_object(info, (socket.gethostname(), listener.getsockname()[1], secrets.token_hex(16)))
            if same_host is None:
                same_host = len({host for host, _, _ in info}) == 1
            if not same_host:
                return GlooBytes()
            key = info[0][2].encode()
            socks: dict[int, socket.socket] = {}
            for peer in range(rank):
                sock = socket.create_connection(("127.0.0.1", info[peer][1]), timeout=timeout_s)
                sock.sendall(key + struct.pack("<q", rank))
                socks[peer] = sock
            while len(socks) < world - 1:
                sock, _ = listener.accept()
                sock.settimeout(timeout_s)
                hello = _recv_exact(sock, len(key) + 8)
                peer = struct.unpack("<q", hello[len(key) :])[0]
                if hello[: len(key)] != key or not rank < peer < world or peer in socks:
                    sock.close()  # not one of this group's ranks
                    continue
                socks[peer] = sock
        for sock in socks.values():
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return PeerMesh(socks, rank, timeout_s)

    def all_gather(self, message: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``message`` (1-D uint8, contiguous; lengths may differ), in rank order; this
        rank's is ``message`` itself."""
        body = message.numpy().data
        prefix = struct.pack("<q", len(body))
        sent = dict.fromkeys(self.socks, 0)
        heads = {peer: bytearray(8) for peer in self.socks}
        got = dict.fromkeys(self.socks, 0)
        bodies: dict[int, torch.Tensor] = {}
        out: dict[int, torch.Tensor] = {self.rank: message}
        for peer, sock in self.socks.items():  # a frame usually fits the socket buffer: no select for it
            sent[peer] = self._send(peer, sock, prefix, body, 0)
        selector, frame = self._selector, 8 + len(body)
        for peer, sock in self.socks.items():
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if sent[peer] < frame else 0)
            selector.register(sock, events, peer)
        deadline = time.monotonic() + self.timeout_s
        try:
            while selector.get_map():
                ready = selector.select(max(0.0, deadline - time.monotonic()))
                if not ready:
                    missing = sorted(p for p in self.socks if p not in out or sent[p] < frame)
                    raise TimeoutError(
                        f"rank {self.rank}: ranks {missing} exchanged nothing within {self.timeout_s:g}s"
                    )
                for key, mask in ready:
                    peer = key.data
                    sock = self.socks[peer]
                    if mask & selectors.EVENT_WRITE:
                        sent[peer] = self._send(peer, sock, prefix, body, sent[peer])
                    if mask & selectors.EVENT_READ:
                        got[peer] = self._receive(peer, sock, heads[peer], got[peer], bodies, out)
                    events = (selectors.EVENT_READ if peer not in out else 0) | (
                        selectors.EVENT_WRITE if sent[peer] < frame else 0
                    )
                    if not events:
                        selector.unregister(sock)
                    elif events != key.events:
                        selector.modify(sock, events, peer)
        finally:
            for registered in list(selector.get_map().values()):
                selector.unregister(registered.fileobj)
        return [out[r] for r in range(len(self.socks) + 1)]

    def _send(self, peer: int, sock: Any, prefix: bytes, body: memoryview, sent: int) -> int:
        views = [prefix[sent:], body] if sent < 8 else [body[sent - 8 :]]
        try:
            return sent + sock.sendmsg(views)
        except BlockingIOError:
            return sent
        except OSError as exc:
            raise ConnectionError(f"rank {self.rank}: rank {peer} is gone (it failed or exited): {exc}") from exc

    def _receive(
        self, peer: int, sock: Any, head: bytearray, got: int, bodies: dict[int, torch.Tensor], out: dict[int, Any]
    ) -> int:
        """Read what is there of ``peer``'s frame (``got`` bytes of it read so far); into ``out`` once whole."""
        while peer not in out:
            if got < 8:
                view, offset = memoryview(head), got
            else:
                if peer not in bodies:
                    bodies[peer] = torch.empty(struct.unpack("<q", head)[0], dtype=torch.uint8)
                view, offset = bodies[peer].numpy().data, got - 8
                if offset == len(view):
                    out[peer] = bodies.pop(peer)
                    break
            try:
                n = sock.recv_into(view[offset:])
            except BlockingIOError:
                break
            except OSError as exc:
                raise ConnectionError(f"rank {self.rank}: rank {peer} is gone (it failed or exited): {exc}") from exc
            if n == 0:
                raise ConnectionError(f"rank {self.rank}: rank {peer} is gone (it failed or exited): connection closed")
            got += n
        return got

    def close(self) -> None:
        self._selector.close()
        for sock in self.socks.values():
            sock.close()


class GlooBytes:
    """:class:`PeerMesh`'s fallback for ranks on different hosts: two gloo all-gathers, the lengths,
    then the messages padded to the longest."""

    def all_gather(self, message: torch.Tensor) -> list[torch.Tensor]:
        world = dist.get_world_size()
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([message.numel()], dtype=torch.int64))
        padded = torch.zeros(max(int(n) for n in sizes), dtype=torch.uint8)
        padded[: message.numel()] = message
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded)
        return [g[: int(n)] for g, n in zip(gathered, sizes, strict=True)]

    def close(self) -> None:
        pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("a peer closed its connection during the handshake")
        data += chunk
    return data


def _groups_of(kind: int) -> tuple[str, ...]:
    """The parameter groups a micro-batch of kind ``_KINDS[kind]`` trains (the divisor's rule)."""
    return ("all", "memory") if _KINDS[kind] == "batch" else ("all", "adapt")


class RowSparseExchange:
    """The ``row_sparse`` gradient exchange (module docstring): after backward, :meth:`pack` makes
    this rank's message of the round -- the status row, then its gradients -- and after the round's
    :meth:`PeerMesh.all_gather`, :meth:`apply` sums every rank's gradients into the group's.

    A message (bytes): the status row (float64 ``[_STATUS + _MAX_TABLES]``: ready, ended, kind,
    n_dense, n_sparse, label sum, rows, then the rows touched per table), then, from a ready rank, for
    every sparse table (``nn.Embedding(sparse=True)``) of the groups its kind trains its touched rows
    (int64, coalesced here, ascending: the lazy SparseAdam's own sort and segment sum), then the flat
    dense gradients of those groups (float32, zeros where this rank has none), then the tables' gradient
    rows (float32). :meth:`apply`: every group ``g`` that ``divisor[g]`` ranks trained gets the sum of
    their gradients in rank order divided by ``divisor[g]`` -- dense parameters as dense tensors, tables
    as one *coalesced* sparse gradient (the ranks' rows merged by the same sort and segment sum), which
    the optimizer takes as it is; the other groups ``grad=None``. The same bytes on every rank give the
    same gradients. ``sent``: bytes of this rank's messages; ``pack_s`` / ``gather_s`` / ``apply_s``:
    seconds spent making them, exchanging them (waiting for the peers included), applying them.

    Example::

        exchange = RowSparseExchange(model)
        loss = trainer.backward(micro_batch)
        messages = mesh.all_gather(exchange.pack(status, kind=0))  # status: float64 [_STATUS + _MAX_TABLES]
        exchange.apply(messages, {"memory": 2, "adapt": 0, "all": 2})
        trainer.apply(micro_batch, loss, started)
    """

    def __init__(self, model: nn.Module):
        self.group = parameter_groups(model)
        sparse = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and m.sparse}
        self.tables = [p for p in model.parameters() if id(p) in sparse]
        self.dense: dict[str, list[nn.Parameter]] = {}
        for p in model.parameters():
            if id(p) not in sparse:
                self.dense.setdefault(self.group[id(p)], []).append(p)
        self.sent, self.pack_s, self.gather_s, self.apply_s = 0, 0.0, 0.0, 0.0

    @property
    def comm_s(self) -> float:
        return self.pack_s + self.gather_s + self.apply_s

    def _tables_of(self, kind: int) -> list[int]:
        groups = _groups_of(kind)
        return [i for i, p in enumerate(self.tables) if self.group[id(p)] in groups]

    def pack(self, status: torch.Tensor, kind: int) -> torch.Tensor:
        """This ready rank's message (uint8): ``status`` (float64; the rows touched per table are
        written into it) and the gradients of what ``kind`` trains."""
        started = time.perf_counter()
        rows, values = [], []
        for i in self._tables_of(kind):
            p = self.tables[i]
            if p.grad is None:
                r, v = torch.empty(0, dtype=torch.int64), p.new_empty(0, p.shape[1])
            else:
                r, v = _coalesced_rows(p.grad)
            status[_STATUS + i] = r.numel()
            rows.append(r)
            values.append(v.contiguous())
        dense = [
            p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
            for g in _groups_of(kind)
            for p in self.dense.get(g, [])
        ]
        parts = [status, *rows, *dense, *values]
        message = torch.cat([t.reshape(-1).view(torch.uint8) for t in parts])
        self.sent += message.numel()
        self.pack_s += time.perf_counter() - started
        return message

    def apply(self, messages: Sequence[torch.Tensor], divisor: Mapping[str, int]) -> None:
        """Set every parameter's gradient to the group's from the round's ``messages`` (rank order)."""
        started = time.perf_counter()
        dense: dict[str, list[torch.Tensor]] = {}
        rows: dict[int, list[torch.Tensor]] = {}
        values: dict[int, list[torch.Tensor]] = {}
        for message in messages:
            status = message[:_HEADER_BYTES].view(torch.float64)
            if status[0] != 1:
                continue
            kind, offset = int(status[2]), _HEADER_BYTES
            tables = [(i, int(status[_STATUS + i])) for i in self._tables_of(kind)]
            for i, n in tables:
                rows.setdefault(i, []).append(message[offset : offset + 8 * n].view(torch.int64))
                offset += 8 * n
            for g in _groups_of(kind):
                n = 4 * sum(p.numel() for p in self.dense.get(g, []))
                dense.setdefault(g, []).append(message[offset : offset + n].view(torch.float32))
                offset += n
            for i, n in tables:
                width = self.tables[i].shape[1]
                values.setdefault(i, []).append(message[offset : offset + 4 * n * width].view(torch.float32))
                values[i][-1] = values[i][-1].view(n, width)
                offset += 4 * n * width
            if offset != message.numel():
                raise ValueError(f"a round's message of {message.numel()} bytes; its status describes {offset}")
        for g, params in self.dense.items():
            if not divisor[g]:
                for p in params:
                    p.grad = None
                continue
            total = functools.reduce(torch.add, dense[g]) / divisor[g]  # rank order: the same everywhere
            offset = 0
            for p in params:
                p.grad = total[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        for i, p in enumerate(self.tables):
            d = divisor[self.group[id(p)]]
            if not d or not sum(r.numel() for r in rows.get(i, [])):
                p.grad = None
                continue
            if len(rows[i]) == 1:
                r, v = rows[i][0], values[i][0]
            else:  # rows of several ranks: merged, each row's values summed in rank order
                merged = torch.sparse_coo_tensor(
                    torch.cat(rows[i]).reshape(1, -1), torch.cat(values[i]), p.shape, check_invariants=False
                )
                r, v = _coalesced_rows(merged)
            p.grad = torch.sparse_coo_tensor(
                r.reshape(1, -1), v / d, p.shape, is_coalesced=True, check_invariants=False
            )
        self.apply_s += time.perf_counter() - started


def _average_hook(state: RankLoop, bucket):  # DDP rejects string annotations
    """(dist.GradBucket) -> Future[Tensor]: each gradient / its group's divisor, summed over the ranks; a
    group no rank trained this round (divisor 0: every rank knows it) is not sent at all."""
    started, flat, offset = time.perf_counter(), bucket.buffer(), 0
    runs: list[tuple[int, int]] = []
    for p in bucket.parameters():  # the bucket holds the parameters' gradients, flat, in this order
        n, d = p.numel(), state.divisor[state.group[id(p)]]
        if d > 1:
            flat[offset : offset + n].div_(d)
        if d and runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + n)
        elif d:
            runs.append((offset, offset + n))
        offset += n

    def done(_: object) -> torch.Tensor:
        state.comm_s += time.perf_counter() - started
        return flat

    state.sent += sum(b - a for a, b in runs) * flat.element_size()
    futures = [dist.all_reduce(flat[a:b], async_op=True).get_future() for a, b in runs]
    return torch.futures.collect_all(futures).then(done)


class RankLoop:
    """One rank's rounds (module docstring). ``pull(wait_s)``: a reader batch; None: ended;
    TimeoutError: none yet.

    Checkpoints (set by the training job): with ``every`` > 0, once ``rounds`` reaches ``next_checkpoint`` the
    ranks stop pulling and finish the reader batches they hold (null steps for the others); at the
    first round in which no rank holds one, every rank calls ``on_checkpoint(rounds)`` -- the same
    round on every rank, decided from the gathered table, so the checkpoint covers whole reader
    batches -- and the next one falls ``every`` rounds later. ``on_batch_done(rounds, batch)``:
    after the last micro-batch of a reader batch; ``before_round(rounds)``: before every round.

    Example::

        loop = RankLoop(spec, lambda wait_s: reader.next_batch(timeout=wait_s))
        loop.run()
        loop.result(rank, wall_s, cpu_s).params_checksum
    """

    def __init__(
        self,
        spec: TrainingSpec,
        pull: Callable[[float], Batch | None],
        *,
        exchange: Exchange = "row_sparse",
        record_ids: bool = False,
        timeout_s: float = 300.0,
        transport: Literal["auto", "gloo"] = "auto",
    ):
        self.spec, self.pull, self.exchange = spec, pull, exchange
        self.timeout_s, self.transport = timeout_s, transport
        self.mesh: PeerMesh | GlooBytes | None = None  # row_sparse, world > 1: the rounds' messages go through it
        self.mesh_s = 0.0  # seconds in mesh.all_gather (waiting for the peers included)
        self.pending, self.ended = deque[Batch](), False
        self.current: Batch | None = None  # the reader batch whose micro-batches are pending
        self.trainer: Trainer | None = None
        self.rounds, self.null_steps, self.comm_s, self.sent = 0, 0, 0.0, 0  # ddp_dense hook: seconds, bytes
        self.widths = (0, 0)
        self.group: dict[int, str] = {}  # id(parameter) -> memory | adapt | all
        self.divisor = {"memory": 1, "adapt": 1, "all": 1}  # of each group in this round (0: not sent)
        self.sample_ids: list[int] | None = [] if record_ids else None
        self.sparse: RowSparseExchange | None = None
        self.every, self.next_checkpoint = 0, 0  # checkpoints every `every` rounds (0: none), the next at
        self.on_checkpoint: Callable[[int], None] | None = None
        self.on_batch_done: Callable[[int, Batch], None] | None = None
        self.before_round: Callable[[int], None] | None = None
        self.on_build: Callable[[Trainer], None] | None = None

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank put into the gradient collectives so far."""
        return self.sparse.sent if self.sparse is not None else self.sent

    @property
    def exchange_s(self) -> float:
        """Seconds of the gradient exchange so far (row_sparse: packing, the round's all-gather, applying)."""
        return self.sparse.pack_s + self.mesh_s + self.sparse.apply_s if self.sparse is not None else self.comm_s

    def reset_counters(self) -> None:
        """Zero the trainer's counters and the exchange's bytes and seconds (after a warm-up)."""
        if self.trainer is not None:
            self.trainer.counters = TrainerStats()
        self.comm_s, self.sent, self.null_steps, self.mesh_s = 0.0, 0, 0, 0.0
        if self.sparse is not None:
            self.sparse.sent, self.sparse.pack_s, self.sparse.apply_s = 0, 0.0, 0.0

    def close(self) -> None:
        """Close the peer connections (also closed when the process exits)."""
        if self.mesh is not None:
            self.mesh.close()
            self.mesh = None

    def _head(self, wait_s: float, pull: bool) -> Batch | None:
        if not self.pending and not self.ended and pull:
            try:
                batch = self.pull(wait_s)
            except TimeoutError:
                return None
            self.ended, size = batch is None, self.spec.batch_size
            if batch is not None:
                self.current = batch
                self.pending.extend(batch.slice(s, s + size) for s in range(0, batch.rows, size))
        return self.pending[0] if self.pending else None

    def build(self, n_dense: int, n_sparse: int) -> Trainer:
        """Build the model and its trainer (every rank at the same round, same seed), then ``on_build``."""
        if self.spec.model.type == "mtrm" and self.spec.model.adapt_batch_weight and dist.get_world_size() > 1:
            raise ValueError(
                "training.model.adapt_batch_weight needs a single trainer: the multi-trainer exchange sends a "
                "batch rank's memory-tower gradients only (set it to 0 or run one trainer)"
            )
        if self.exchange == "row_sparse":
            model = build_model(self.spec.model, n_dense, n_sparse, seed=self.spec.seed)
            self.sparse = RowSparseExchange(model) if dist.get_world_size() > 1 else None
            if self.sparse is not None and len(self.sparse.tables) > _MAX_TABLES:
                raise ValueError(f"{len(self.sparse.tables)} sparse embedding tables; at most {_MAX_TABLES}")
            self.trainer = Trainer(model, self.spec, observe_labels=False)
        else:  # dense embedding gradients: the comm hook reduces flat dense buckets
            model_spec = self.spec.model.model_copy(update={"sparse_embeddings": False})
            model = build_model(model_spec, n_dense, n_sparse, seed=self.spec.seed)
            ddp = DistributedDataParallel(
                model,
                find_unused_parameters=isinstance(model, MTRM),
                forward_sync_buffers=False,
                gradient_as_bucket_view=True,
            )
            ddp.register_comm_hook(self, _average_hook)
            self.trainer = Trainer(model, self.spec, module=ddp, observe_labels=False)
        self.group, self.widths = parameter_groups(model), (n_dense, n_sparse)
        if self.on_build is not None:
            self.on_build(self.trainer)
        return self.trainer

    def _null_step(self, trainer: Trainer, kind: str, messages: list[torch.Tensor] | None) -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        if self.exchange == "ddp_dense":
            dense, sparse = torch.zeros(0, self.widths[0]), torch.zeros(0, self.widths[1], dtype=torch.int64)
            (trainer.module(dense, sparse, kind).sum() * 0.0).backward()
        elif self.sparse is not None and messages is not None:
            self.sparse.apply(messages, self.divisor)
        trainer.optimizer.step()
        self.null_steps += 1

    def _observe(self, model: nn.Module, ready: torch.Tensor) -> None:
        """Every ready rank's label sum and count, in rank order (MTRM's label-delay calibration)."""
        if isinstance(model, MTRM):
            for row in ready.tolist():
                index = int(row[2])
                model.label_sums[index] += row[5]
                model.label_counts[index] += row[6]

    def _checkpoint_due(self) -> bool:
        return self.every > 0 and self.rounds >= self.next_checkpoint

    def _gather(
        self, mine: torch.Tensor, message: torch.Tensor | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The round's status table ``[world, _STATUS + _MAX_TABLES]`` and, through the mesh, every
        rank's message (``message``: this rank's; None: its status alone)."""
        if self.mesh is None:
            rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(rows, mine)
            return torch.stack(rows), None
        started = time.perf_counter()
        messages = self.mesh.all_gather(mine.view(torch.uint8) if message is None else message)
        self.mesh_s += time.perf_counter() - started
        return torch.stack([m[:_HEADER_BYTES].view(torch.float64) for m in messages]), messages

    def run(self, max_rounds: int | None = None) -> None:
        """Rounds until every rank's data ended (or ``max_rounds`` training rounds)."""
        wait_s, done = 0.0, 0
        if self.mesh is None and self.exchange == "row_sparse" and dist.get_world_size() > 1:
            self.mesh = PeerMesh.connect(self.timeout_s, same_host=False if self.transport == "gloo" else None)
        while max_rounds is None or done < max_rounds:
            if self.before_round is not None:
                self.before_round(self.rounds)
            draining = self._checkpoint_due()
            head = self._head(wait_s, pull=not draining)
            mine = torch.zeros(_STATUS + _MAX_TABLES, dtype=torch.float64)
            mine[1] = float(self.ended)
            loss, started, message = None, time.perf_counter(), None
            if head is not None:
                label_sum = float(model_inputs(head)[2].sum())
                shape = (head.dense.shape[1], head.sparse.shape[1])
                mine[:_STATUS] = torch.tensor([1, mine[1], _KINDS.index(head.kind), *shape, label_sum, head.rows])
                if self.exchange == "row_sparse":  # backward first: its touched rows ride in the status
                    trainer = self.trainer or self.build(*shape)
                    loss = trainer.backward(head)
                    if self.sparse is not None:
                        message = self.sparse.pack(mine, int(mine[2]))
            table, messages = self._gather(mine, message)
            ready = table[table[:, 0] == 1]
            if not len(ready):
                all_ended = bool((table[:, 1] == 1).all())
                if draining and not all_ended and self.on_checkpoint is not None:
                    self.on_checkpoint(self.rounds)  # every rank, this round: nobody holds a reader batch
                    self.next_checkpoint = self.rounds + self.every
                    continue
                if all_ended:
                    return
                wait_s = 0.02  # after a round in which nobody had data, every rank waits for some a little
                continue
            wait_s, done, self.rounds = 0.0, done + 1, self.rounds + 1
            trainer = self.trainer or self.build(int(ready[0, 3]), int(ready[0, 4]))
            if (widths := {(int(r[3]), int(r[4])) for r in ready}) != {self.widths}:
                raise ValueError(f"batches of input widths {sorted(widths)}; the model's: {self.widths}")
            n_batch, n_stream = int((ready[:, 2] == 0).sum()), int((ready[:, 2] == 1).sum())
            self.divisor.update(memory=n_batch, adapt=n_stream, all=len(ready))
            self._observe(trainer.model, ready)
            if head is None:
                self._null_step(trainer, "batch" if n_batch else "stream", messages)
                continue
            micro = self.pending.popleft()
            if loss is None:  # ddp_dense: DDP exchanges inside backward
                trainer.train_step(micro)
            else:
                if self.sparse is not None and messages is not None:
                    self.sparse.apply(messages, self.divisor)
                trainer.apply(micro, loss, started)
            if self.sample_ids is not None and head.sample_id is not None:
                self.sample_ids.extend(head.sample_id.tolist())
            if not self.pending and self.current is not None:
                finished, self.current = self.current, None
                if self.on_batch_done is not None:
                    self.on_batch_done(self.rounds, finished)

    def result(self, rank: int, wall_s: float, cpu_s: float) -> RankResult:
        c = self.trainer.counters if self.trainer else TrainerStats()
        checksum, abs_sum = params_checksum(self.trainer.model) if self.trainer else ("", 0.0)
        return RankResult(
            rank,
            c.step,
            c.samples,
            dict(c.samples_by_kind),
            wall_s,
            c.train_s,
            checksum,
            abs_sum,
            self.null_steps,
            cpu_s,
            self.sample_ids,
        )


def pin_cores(cores: Sequence[int] | None) -> None:
    """Bind this process to ``cores`` (Linux; a no-op for None or elsewhere)."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, list(cores))


def serve_rank(
    rank: int,
    world_size: int,
    init_method: str,
    n_threads: int,
    out_queue: Any,
    body: Callable[[], Any],
    *,
    timeout_s: float = 600.0,
) -> None:
    """Join the group (collectives time out after ``timeout_s``), run ``body``; put ``(rank, "ok",
    result)`` or ``(rank, "error", (time, traceback))`` -- the time taken before leaving the group,
    whose end makes the other ranks fail too."""
    torch.set_num_threads(n_threads)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    try:
        out_queue.put((rank, "ok", body()))
    except BaseException:
        out_queue.put((rank, "error", (time.time(), traceback.format_exc())))
        raise
    finally:
        dist.destroy_process_group()


def ddp_worker(
    rank: int,
    world_size: int,
    init_method: str,
    driver_location: str,
    token: str | None,
    training_spec_json: str,
    n_threads: int,
    out_queue: Any,
    record_ids: bool,
    exchange: Exchange = "row_sparse",
    kind_weights: dict[str, float] | None = None,
    timeout_s: float = 600.0,
) -> None:
    """One rank of :func:`run_ddp`: reads trainer ``rank``'s batches from the data plane and trains."""

    def body() -> RankResult:
        spec = TrainingSpec.model_validate_json(training_spec_json)
        started, cpu0 = time.perf_counter(), time.process_time()
        chooser = MixturePriority(kind_weights or {}, seed=spec.seed + rank) if spec.mode == "mixed" else None
        with (
            DriverClient(driver_location, token=token) as client,
            RemoteReader(client, rank, token=token, choose_queue=chooser) as reader,
        ):
            loop = RankLoop(
                spec,
                lambda wait_s: reader.next_batch(timeout=wait_s),
                exchange=exchange,
                record_ids=record_ids,
                timeout_s=timeout_s,
            )
            loop.run()
            loop.close()
        return loop.result(rank, time.perf_counter() - started, time.process_time() - cpu0)

    serve_rank(rank, world_size, init_method, n_threads, out_queue, body, timeout_s=timeout_s)


def ddp_in_memory_worker(
    rank: int,
    world_size: int,
    init_method: str,
    training_spec_json: str,
    n_threads: int,
    out_queue: Any,
    shard_paths: list[str],
    warmup_steps: int,
    exchange: Exchange = "row_sparse",
    cores: list[list[int] | None] | None = None,
    transport: Literal["auto", "gloo"] = "auto",
    timeout_s: float = 600.0,
) -> None:
    """One rank on in-memory micro-batches (a pickled list of :class:`Batch` at ``shard_paths[rank]``),
    bound to ``cores[rank]``: ``warmup_steps`` rounds, then the timed loop over the whole shard.
    ``extra``: seconds in the gradient exchange (``exchange_s``; row_sparse: of which ``pack_s``
    making this rank's messages, ``gather_s`` exchanging them, waiting for the peer included,
    ``apply_s`` summing the gradients), bytes this rank put into its collectives per round
    (``exchange_bytes_per_step``), seconds of one gloo all-reduce of that many bytes
    (``allreduce_probe_s``)."""

    def body() -> RankResult:
        pin_cores(cores[rank] if cores else None)
        with open(shard_paths[rank], "rb") as file:
            shard: list[Batch] = pickle.load(file)  # written by the caller (bench/train_throughput.py)
        warm = itertools.cycle(shard)
        spec = TrainingSpec.model_validate_json(training_spec_json)
        loop = RankLoop(spec, lambda _: next(warm), exchange=exchange, timeout_s=timeout_s, transport=transport)
        loop.run(max_rounds=warmup_steps)
        assert loop.trainer is not None
        loop.reset_counters()
        timed = iter(shard)
        loop.pull, loop.pending = (lambda _: next(timed, None)), deque()
        dist.barrier()
        started, cpu0 = time.perf_counter(), time.process_time()
        loop.run()
        dist.barrier()
        result = loop.result(rank, time.perf_counter() - started, time.process_time() - cpu0)
        per_step = loop.bytes_sent / max(1, result.steps + result.null_steps)
        longest = torch.tensor([per_step])  # the ranks' messages differ in size: probe the largest
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        flat, probe0 = torch.zeros(int(longest) // 4), time.perf_counter()
        for _ in range(5):
            dist.all_reduce(flat)
        result.extra = {
            "exchange_s": loop.exchange_s,
            "exchange_bytes_per_step": per_step,
            "allreduce_probe_s": (time.perf_counter() - probe0) / 5,
        }
        if loop.sparse is not None:
            result.extra.update(pack_s=loop.sparse.pack_s, gather_s=loop.mesh_s, apply_s=loop.sparse.apply_s)
        loop.close()
        return result

    serve_rank(rank, world_size, init_method, n_threads, out_queue, body, timeout_s=timeout_s)


def _launch(
    target: Callable[..., None],
    world_size: int,
    make_args: Callable[[int, str, Any], tuple[Any, ...]],
    timeout_s: float,
) -> list[RankResult]:
    """Spawn ``world_size`` ranks of ``target(*make_args(rank, init_method, out_queue))``; their results."""
    out: Any = (ctx := mp.get_context("spawn")).Queue()
    init, deadline = f"tcp://127.0.0.1:{free_port()}", time.monotonic() + timeout_s
    procs = [
        ctx.Process(target=target, args=make_args(rank, init, out), name=f"ddp-rank-{rank}", daemon=True)
        for rank in range(world_size)
    ]
    results, errors, dead = dict[int, RankResult](), dict[int, tuple[float, str]](), dict[int, int]()
    try:
        for proc in procs:
            proc.start()
        while len(results) + len(errors) < world_size and time.monotonic() < deadline:
            try:
                rank, status, payload = out.get(timeout=0.2)
                (results if status == "ok" else errors)[rank] = payload
            except queue_mod.Empty:  # quiet after an error, or a rank gone without a word (twice): stop
                if errors or dead:
                    break
                dead = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode and r not in results}
    finally:
        for proc in procs:
            proc.join(30 if len(results) == world_size else 1)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    if errors:  # the first to fail is the cause; the others lost their peer
        rank = min(errors, key=lambda r: errors[r][0])
        raise RuntimeError(
            f"DDP rank {rank} failed (exit code {procs[rank].exitcode}; failed ranks: "
            f"{sorted(errors)}):\n{errors[rank][1]}"
        )
    for rank, code in dead.items():
        raise RuntimeError(f"DDP rank {rank} died with exit code {code}")
    if len(results) < world_size:
        raise TimeoutError(f"DDP group of {world_size}: only ranks {sorted(results)} done within {timeout_s:g}s")
    return [results[r] for r in range(world_size)]


def run_ddp(
    plane: DirectDataPlane,
    spec: TrainingSpec,
    world_size: int,
    *,
    threads_per_rank: int = 1,
    record_ids: bool = False,
    exchange: Exchange = "row_sparse",
    timeout_s: float = 600,
) -> list[RankResult]:
    """Train ``spec``'s model on the plane's data with ``world_size`` ranks (``spawn``-ed
    processes, gloo on loopback); results by rank. RuntimeError naming the rank when one fails."""
    if plane.trainers != world_size:
        raise ValueError(f"the data plane serves {plane.trainers} trainers; world_size is {world_size}")
    return _launch(
        ddp_worker,
        world_size,
        lambda rank, init, out: (
            rank,
            world_size,
            init,
            plane.location,
            plane.token,
            spec.model_dump_json(),
            threads_per_rank,
            out,
            record_ids,
            exchange,
            plane.job.kind_weights(),
            timeout_s,
        ),
        timeout_s,
    )


def run_ddp_in_memory(
    shard_paths: list[str],
    spec: TrainingSpec,
    *,
    threads_per_rank: int = 1,
    warmup_steps: int = 5,
    exchange: Exchange = "row_sparse",
    timeout_s: float = 600,
    cores: list[list[int] | None] | None = None,
    transport: Literal["auto", "gloo"] = "auto",
) -> list[RankResult]:
    """:func:`ddp_in_memory_worker` on ``len(shard_paths)`` ranks (benchmarks: a group without a data
    plane); rank ``r`` bound to ``cores[r]`` (None: unbound); ``transport="gloo"``: the row-sparse
    exchange over gloo (:class:`GlooBytes`) instead of the peer sockets."""
    return _launch(
        ddp_in_memory_worker,
        len(shard_paths),
        lambda rank, init, out: (
            rank,
            len(shard_paths),
            init,
            spec.model_dump_json(),
            threads_per_rank,
            out,
            list(shard_paths),
            warmup_steps,
            exchange,
            cores,
            transport,
            timeout_s,
        ),
        timeout_s,
    )
