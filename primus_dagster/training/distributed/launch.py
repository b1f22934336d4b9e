"""Starting ranks: the one way a group of rank processes is spawned, joined, watched and stopped.

A rank is a ``spawn``-ed process running ``target(rank, init_method, out, *args)`` (module-level,
importable in the child by its module path: spawn pickles ``target`` and ``args``; the child gets the
parent's ``sys.path``); inside it, :func:`serve_rank` joins the group (gloo, ``init_method``), runs the
rank's body and puts its result or its traceback on ``out``. The parent holds the group in a
:class:`RankProcesses`: it starts the ranks, reads ``out``, watches them (``exit_codes``,
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
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from primus_dagster.ports import free_port


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


class RankProcesses:
    """``world_size`` daemonic ``spawn``-ed processes of ``target(rank, init_method, out, *args)``,
    named ``f"{name}-{rank}"`` (module docstring); ``init_method``: a free loopback TCP port, ``out``:
    the queue they report on. A context manager: ``with`` starts them and stops them on the way out,
    whatever happened.

    Example::

        with RankProcesses(worker, 2, plan) as ranks:
            rank, kind, payload = ranks.out.get(timeout=60)
            ranks.exit_codes()          # [None, None]: both still running
    """

    def __init__(self, target: Callable[..., None], world_size: int, *args: Any, name: str = "rank"):
        ctx = mp.get_context("spawn")
        self.out: Any = ctx.Queue()
        self.init_method = f"tcp://127.0.0.1:{free_port()}"
        self.procs = [
            ctx.Process(
                target=target, args=(rank, self.init_method, self.out, *args), name=f"{name}-{rank}", daemon=True
            )
            for rank in range(world_size)
        ]

    @property
    def world_size(self) -> int:
        return len(self.procs)

    def start(self) -> RankProcesses:
        """Start every rank (those started are stopped if one cannot be)."""
        try:
            for proc in self.procs:
                proc.start()
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
