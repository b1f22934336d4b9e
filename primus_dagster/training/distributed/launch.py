"""Starting ranks: the one way a group of rank processes is started, joined, watched and stopped.

A rank is a process running ``target(rank, init_method, out, *args)`` (module-level, importable in the
rank by its module path: ``target`` and ``args`` are pickled to it); inside it, :func:`serve_rank` joins
the group (gloo, ``init_method``: the rendezvous of torchrun's environment variables), runs the rank's
body and puts its result or its traceback on ``out`` (its :class:`RankOutbox`). The parent holds the
group in a :class:`RankProcesses`: it starts the ranks, reads their messages (``out``, a
:class:`RankInbox`), watches them (``exit_codes``, ``procs[r].pid``: None for a rank on another machine)
and stops them whatever happens (terminate, then kill, reap). A group that only returns results hands it
to :func:`collect_results`.

*How* the ranks start is a :class:`RankLauncher`: :class:`SpawnLauncher` (the default) ``spawn``-s them
as children of this process, each with a pipe of its own to it (the child gets the parent's
``sys.path``); :class:`~.channel.DialBackLauncher` has someone else start them (plain processes, pods)
and each rank dials back to a channel the parent listens on. Either way a rank's channel is a
``multiprocessing`` :class:`~multiprocessing.connection.Connection` and each started rank a
:class:`RankHandle` (a ``multiprocessing.Process`` is one).

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
from typing import Any, Protocol, cast

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


def rank_entry(
    target: Callable[..., None], environment: Mapping[str, str], rank: int, init: str, conn: Any, *args: Any
) -> None:
    """A started rank: its own rendezvous variables into its environment, then ``target`` with its outbox
    on ``conn`` (its channel to the parent)."""
    os.environ.update(environment)
    target(rank, init, RankOutbox(conn), *args)


class RankHandle(Protocol):
    """One started rank, as the parent watches and stops it (a ``multiprocessing.Process`` is one; a rank
    pod's handle is another). ``exitcode``: None while it runs, negative for a signal; ``pid``: its process
    id on this host, None for a rank elsewhere (a pod: its memory limit is the kubelet's to enforce).

    Example::

        handle.terminate(); handle.join(5)
        if handle.is_alive():
            handle.kill()
        handle.exitcode                   # -15: terminated
    """

    @property
    def exitcode(self) -> int | None: ...

    @property
    def pid(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


class RankLauncher(Protocol):
    """How a group's ranks are started and reach the parent: :class:`RankProcesses`'s strategy.

    :meth:`start` starts ``world_size`` ranks of ``target(rank, init_method, out, *args)`` (``init_method``
    ``"env://"``: each rank finds torchrun's rendezvous variables in its environment), appends each rank's
    :class:`RankHandle` to ``procs`` as soon as it is started (the caller stops them whatever happens,
    also when :meth:`start` raises) and returns each rank's channel, by rank; :meth:`release` frees what
    the last :meth:`start` made for its ranks once they are stopped (a rank pod's Service and Secret).
    ``children``: the ranks are child processes of this one on this host (their cores may be pinned
    here; they check that this process is their parent), else they watch their channel instead.

    Example::

        with RankProcesses(worker, 2, plan, launcher=SpawnLauncher(["127.0.0.1", "127.0.0.2"])) as ranks:
            ranks.out.get(timeout=60)
    """

    children: bool

    def start(
        self, target: Callable[..., None], args: tuple[Any, ...], *, world_size: int, name: str, procs: list[Any]
    ) -> list[Connection]: ...

    def release(self) -> None: ...


INIT_METHOD = "env://"


class SpawnLauncher:
    """Ranks as daemonic ``spawn``-ed children of this process, named ``f"{name}-{rank}"``, each with a
    pipe of its own to it; ``addresses``: per rank, the address it listens on for its peers (default
    loopback for all; distinct loopback addresses stand for hosts in tests), the rendezvous on rank 0's
    address and a free port there (:func:`rank_environment`).

    Example::

        launcher = SpawnLauncher(["127.0.0.1", "127.0.0.2"])       # two "hosts" on this host
        with RankProcesses(worker, 2, plan, launcher=launcher) as ranks:
            ...
    """

    children = True

    def __init__(self, addresses: Sequence[str] | None = None):
        self.addresses = list(addresses) if addresses is not None else None

    def start(
        self, target: Callable[..., None], args: tuple[Any, ...], *, world_size: int, name: str, procs: list[Any]
    ) -> list[Connection]:
        addresses = self.addresses if self.addresses is not None else ["127.0.0.1"] * world_size
        if len(addresses) != world_size:
            raise ValueError(f"{len(addresses)} rank addresses for a group of {world_size}")
        ctx = mp.get_context("spawn")
        master, port = addresses[0], free_port(addresses[0])
        readers: list[Connection] = []
        try:
            for rank in range(world_size):
                reader, writer = ctx.Pipe(duplex=False)
                readers.append(reader)
                environment = rank_environment(rank, world_size, master, port, addresses[rank])
                proc = ctx.Process(
                    target=rank_entry,
                    args=(target, environment, rank, INIT_METHOD, writer, *args),
                    name=f"{name}-{rank}",
                    daemon=True,
                )
                try:
                    proc.start()
                finally:
                    writer.close()  # the rank's pipe ends when the rank does
                procs.append(proc)
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        return readers

    def release(self) -> None:
        pass


class RankProcesses:
    """``world_size`` ranks of ``target(rank, init_method, out, *args)`` (module docstring), started by
    ``launcher`` (default :class:`SpawnLauncher` on ``addresses``: per rank, the address it listens on for
    its peers, default loopback for all; give a launcher its addresses itself); ``init_method``:
    ``"env://"``, the rendezvous in each rank's environment; ``out``: the :class:`RankInbox` they report
    on; ``procs``: their :class:`RankHandle` by rank, once started. A context manager: ``with`` starts
    them and stops them on the way out, whatever happened.

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
        launcher: RankLauncher | None = None,
    ):
        if addresses is not None and len(addresses) != world_size:
            raise ValueError(f"{len(addresses)} rank addresses for a group of {world_size}")
        if addresses is not None and launcher is not None:
            raise ValueError("give the rank addresses to the launcher")
        self.target, self.args, self.name, self._world = target, args, name, world_size
        self.launcher: RankLauncher = launcher if launcher is not None else SpawnLauncher(addresses)
        self.init_method = INIT_METHOD
        self.procs: list[RankHandle] = []
        self.out = RankInbox([])
        self._released = True

    @property
    def world_size(self) -> int:
        return self._world

    def start(self) -> RankProcesses:
        """Start every rank (those started are stopped if one cannot be, or if one never reaches us)."""
        self._released = False
        try:
            conns = self.launcher.start(
                self.target, self.args, world_size=self._world, name=self.name, procs=self.procs
            )
            self.out = RankInbox(conns)
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
        codes: list[int | None] = [proc.exitcode for proc in self.procs]
        return codes + [None] * (self._world - len(codes))

    def alive(self) -> list[int]:
        """The ranks still running."""
        return [rank for rank, proc in enumerate(self.procs) if proc.is_alive()]

    def join(self, timeout_s: float, ranks: Iterable[int] | None = None) -> bool:
        """Wait up to ``timeout_s`` in all for ``ranks`` (default: all) to exit; True when they have."""
        deadline = time.monotonic() + timeout_s
        chosen = range(len(self.procs)) if ranks is None else [r for r in ranks if r < len(self.procs)]
        procs = [self.procs[r] for r in chosen]
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        return not any(proc.is_alive() for proc in procs)

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate the ranks still alive, kill those that do not stop within ``grace_s``, reap them all,
        then let the launcher free what it made for them."""
        try:
            for proc in self.procs:
                if proc.is_alive():
                    proc.terminate()
            deadline = time.monotonic() + grace_s
            for proc in self.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
        finally:
            self.out.close()
            if not self._released:
                self._released = True
                self.launcher.release()


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
