"""Starting ranks: the one way a group of rank processes is spawned, joined, watched and stopped.

A rank is a ``spawn``-ed process running ``target(rank, init_method, out, *args)`` (module-level,
importable in the child by its module path: spawn pickles ``target`` and ``args``; the child gets the
parent's ``sys.path``); inside it, :func:`serve_rank` joins the group (gloo, ``init_method``: the
rendezvous of torchrun's environment variables), runs the rank's body and puts its result or its
traceback on ``out`` (its :class:`RankOutbox`). The parent holds the group in a :class:`RankProcesses`:
it starts the ranks, reads their messages (``out``, a :class:`RankInbox`), watches them (``exit_codes``,
``procs[r].pid``) and stops them whatever happens (terminate, then kill, reap). A group that only
returns results hands it to :func:`collect_results`.

Messages on ``out`` are ``(rank, kind, payload)``: :func:`serve_rank` puts ``(rank, "ok", result)``
or ``(rank, "error", (time.time(), traceback))``; a body may put its own kinds before (progress,
checkpoints, ...).

Example (a group that returns results)::

    def worker(rank: int, init_method: str, out: Any, plan: Plan) -> None:   # module-level
        pin_cores(plan.cores[rank])
        serve_rank(rank, plan.world, init_method, plan.threads, out, lambda: train(rank, plan))

    with RankProcesses(worker, plan.world, plan, name="ddp-rank") as ranks:
        results = collect_results(ranks, timeout_s=600)      # by rank; RuntimeError naming a failed rank

Example (a parent that serves the ranks' messages while they run)::

    with RankProcesses(rank_main, world, plan, name="trainer-rank") as ranks:   # stopped on the way out
        results, errors = {}, {}
        while len(results) < world:
            watch_memory(ranks.procs)                          # e.g. psutil.Process(proc.pid)
            try:
                rank, kind, payload = ranks.out.get(timeout=0.2)
            except queue.Empty:
                if errors:
                    break
                gone = {r: c for r, c in enumerate(ranks.exit_codes()) if c is not None and r not in results}
                ...                                           # a rank exited without a word
                continue
            if kind == "ok":
                results[rank] = payload
            elif kind == "error":
                errors[rank] = payload
            else:
                handle(rank, kind, payload)                   # progress, checkpoints, ...
        if errors:
            raise RuntimeError(errors[first_failure(errors)][1])
        ranks.join(30)                                        # let them leave the group on their own
"""

from __future__ import annotations

import os
import queue as queue_mod
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from primus_dagster.ports import free_port
from primus_dagster.training.distributed.mesh import RANK_ADDR_ENV


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


def first_failure(errors: Mapping[int, tuple[float, str]]) -> int:
    """The rank whose ``"error"`` came first (:func:`serve_rank`'s time): the cause; the others lost
    their peer."""
    return min(errors, key=lambda r: errors[r][0])


def rank_environment(rank: int, world_size: int, master: str, port: int, address: str) -> dict[str, str]:
    """What a rank process finds in its environment: torchrun's rendezvous variables (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``; ``init_method="env://"`` reads them) and the address its
    peers reach it at (:data:`~.mesh.RANK_ADDR_ENV`). A rank started elsewhere (a pod, ``torchrun``) gets
    the same variables from its launcher.

    >>> rank_environment(1, 2, "10.0.0.5", 29500, "10.0.0.6")["RANK"]
    '1'
    """
    return {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        RANK_ADDR_ENV: address,
    }


class RankOutbox:
    """A rank's end of its own message pipe to the parent (what ``target`` gets as ``out``):
    :meth:`put` sends at once, in the calling thread. A pipe per rank, not one shared queue: a rank
    killed in the middle of a message tears its own pipe only, which the parent reads as the rank gone
    (a shared ``multiprocessing.Queue`` would block every later read on the torn message)."""

    def __init__(self, conn: Connection):
        self._conn, self._lock = conn, threading.Lock()

    def put(self, item: Any) -> None:
        with self._lock:
            self._conn.send(item)


class RankInbox:
    """The parent's end of every rank's pipe: :meth:`get` the next message of any rank. A pipe that ends
    (its rank exited, or was killed mid-message) is dropped; the rank's exit code tells the rest."""

    def __init__(self, conns: Sequence[Connection]):
        self._open = list(conns)

    def get(self, timeout: float) -> Any:
        """The next message of any rank; ``queue.Empty`` when none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if not self._open:
                time.sleep(max(0.0, left))
                raise queue_mod.Empty
            ready = mp_connection.wait(self._open, max(0.0, left))
            if not ready:
                raise queue_mod.Empty
            for conn in cast(list[Connection], ready):  # wait() returns the connections it was given
                try:
                    return conn.recv()
                except (EOFError, OSError):  # the rank is gone: a torn message, or none
                    self._open.remove(conn)
                    conn.close()

    def close(self) -> None:
        for conn in self._open:
            conn.close()
        self._open = []


def _rank_entry(
    target: Callable[..., None], environment: Mapping[str, str], rank: int, init: str, conn: Any, *args: Any
) -> None:
    """A spawned rank: its own rendezvous variables into its environment, then ``target`` with its outbox."""
    os.environ.update(environment)
    target(rank, init, RankOutbox(conn), *args)


class RankProcesses:
    """``world_size`` daemonic ``spawn``-ed processes of ``target(rank, init_method, out, *args)``,
    named ``f"{name}-{rank}"`` (module docstring); ``init_method``: ``"env://"``, the rendezvous in each
    rank's environment (:func:`rank_environment`: rank 0's address and a free port there), ``out``: the
    queue they report on. ``addresses``: per rank, the address it listens on for its peers (default
    loopback for all; distinct loopback addresses stand for hosts in tests). A context manager: ``with``
    starts them and stops them on the way out, whatever happened.

    Example::

        with RankProcesses(worker, 2, plan) as ranks:
            rank, kind, payload = ranks.out.get(timeout=60)
            ranks.exit_codes()          # [None, None]: both still running
    """

    def __init__(
        self,
        target: Callable[..., None],
        world_size: int,
        *args: Any,
        name: str = "rank",
        addresses: Sequence[str] | None = None,
    ):
        addresses = list(addresses) if addresses is not None else ["127.0.0.1"] * world_size
        if len(addresses) != world_size:
            raise ValueError(f"{len(addresses)} rank addresses for a group of {world_size}")
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
        self.out = RankInbox([reader for reader, _ in pipes])
        self._writers = [writer for _, writer in pipes]  # closed here once the rank has its own
        self.init_method = "env://"
        master, port = addresses[0], free_port(addresses[0])
        self.procs = [
            ctx.Process(
                target=_rank_entry,
                args=(
                    target,
                    rank_environment(rank, world_size, master, port, addresses[rank]),
                    rank,
                    self.init_method,
                    self._writers[rank],
                    *args,
                ),
                name=f"{name}-{rank}",
                daemon=True,
            )
            for rank in range(world_size)
        ]

    @property
    def world_size(self) -> int:
        return len(self.procs)

    def start(self) -> RankProcesses:
        """Start every rank (those started are stopped if one cannot be)."""
        try:
            for proc, writer in zip(self.procs, self._writers, strict=True):
                proc.start()
                writer.close()  # the rank's pipe ends when the rank does
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> RankProcesses:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def exit_codes(self) -> list[int | None]:
        """Each rank's exit code, by rank (None: running, or not started)."""
        return [proc.exitcode for proc in self.procs]

    def alive(self) -> list[int]:
        """The ranks still running."""
        return [rank for rank, proc in enumerate(self.procs) if proc.pid is not None and proc.is_alive()]

    def join(self, timeout_s: float, ranks: Iterable[int] | None = None) -> bool:
        """Wait up to ``timeout_s`` in all for ``ranks`` (default: all) to exit; True when they have."""
        deadline = time.monotonic() + timeout_s
        procs = [self.procs[r] for r in (range(self.world_size) if ranks is None else ranks)]
        for proc in procs:
            if proc.pid is not None:
                proc.join(max(0.0, deadline - time.monotonic()))
        return not any(proc.pid is not None and proc.is_alive() for proc in procs)

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate the ranks still alive, kill those that do not stop within ``grace_s``, reap them all."""
        for proc in self.procs:
            if proc.pid is not None and proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            if proc.pid is None:
                continue
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for writer in self._writers:
            writer.close()
        self.out.close()


def collect_results(ranks: RankProcesses, timeout_s: float) -> list[Any]:
    """Every rank's ``"ok"`` result, by rank, from started ``ranks`` whose targets end in
    :func:`serve_rank` (other messages are not expected); then the ranks are stopped. RuntimeError
    naming the first rank that failed (with its traceback) or one that died without a word (nonzero
    exit code); TimeoutError when not every rank is done within ``timeout_s``."""
    world = ranks.world_size
    results, errors, dead = dict[int, Any](), dict[int, tuple[float, str]](), dict[int, int]()
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < world and time.monotonic() < deadline:
            try:
                rank, status, payload = ranks.out.get(timeout=0.2)
                (results if status == "ok" else errors)[rank] = payload
            except queue_mod.Empty:  # quiet after an error, or a rank gone without a word (twice): stop
                if errors or dead:
                    break
                dead = {r: code for r, code in enumerate(ranks.exit_codes()) if code and r not in results}
    finally:
        if len(results) == world:
            ranks.join(30)  # they leave the group on their own
        else:
            ranks.join(5, errors)  # a failed rank is on its way out: its exit code for the message
            ranks.join(1)
        ranks.stop()
    if errors:  # the first to fail is the cause; the others lost their peer
        rank = first_failure(errors)
        raise RuntimeError(
            f"DDP rank {rank} failed (exit code {ranks.exit_codes()[rank]}; failed ranks: "
            f"{sorted(errors)}):\n{errors[rank][1]}"
        )
    for rank, code in dead.items():
        raise RuntimeError(f"DDP rank {rank} died with exit code {code}")
    if len(results) < world:
        raise TimeoutError(f"DDP group of {world}: only ranks {sorted(results)} done within {timeout_s:g}s")
    return [results[r] for r in range(world)]
