"""Ranks that are not children of the parent: started as plain processes (``python -m
primus_dagster.training.distributed.dial_back``), they dial back to the parent's rank channel
(``primus_dagster.training.distributed.channel``).

Two ranks on two "hosts" (127.0.0.1 and 127.0.0.2: each rank's peer address; the rendezvous on rank 0's)
run a gloo all_reduce; a rank that never dials back, one that exits first and one with the wrong key end
the start with an error naming the rank and the channel, never a hang; a rank whose channel ends stops on
its own. A training run through ``train_window`` on dial-back ranks (pods, run as processes by the fake
Kubernetes API): ``tests/cluster/kubernetes/test_k8s_trainers.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from primus_dagster.training.distributed import (
    ChannelError,
    ChannelTimeoutError,
    DialBackLauncher,
    ProcessStarter,
    RankProcesses,
    collect_results,
    serve_rank,
)
from primus_dagster.training.distributed.channel import (
    CHANNEL_ENV,
    PARENT_GONE_EXIT,
    ProcessRank,
    dial_back,
    parse_channel,
)
from primus_dagster.training.distributed.mesh import RANK_ADDR_ENV

HERE = str(Path(__file__).resolve().parent)
HOSTS = ("127.0.0.1", "127.0.0.2")
# the ranks import this module to run its targets (they do not inherit this process's sys.path)
ENV = {"PYTHONPATH": os.pathsep.join([HERE, *filter(None, [os.environ.get("PYTHONPATH")])])}


def all_reduce_rank(rank: int, init_method: str, out: Any, world: int) -> None:
    """Sum ``rank + 1`` over the group (gloo); the result and this rank's peer address."""

    def body() -> tuple[float, str]:
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        return float(value.item()), os.environ[RANK_ADDR_ENV]

    serve_rank(rank, world, init_method, 1, out, body, timeout_s=60)


def idle_process() -> ProcessRank:
    """A process that never dials back (it waits for its stdin, which nobody writes)."""
    return ProcessRank(subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE))


def test_two_ranks_on_two_hosts_dial_back_and_all_reduce() -> None:
    launcher = DialBackLauncher.local(HOSTS, env=ENV, dial_timeout_s=60)
    with RankProcesses(all_reduce_rank, 2, 2, launcher=launcher) as ranks:
        assert all(proc.pid is not None for proc in ranks.procs)  # plain processes: a pid here
        results = collect_results(ranks, timeout_s=60)
    assert results == [(3.0, HOSTS[0]), (3.0, HOSTS[1])]
    assert ranks.exit_codes() == [0, 0] and ranks.alive() == []


class DialingThread:
    """A rank handle whose rank is a thread of this process that dials back and holds its connection (a rank
    that reaches the parent at once, without a process to start)."""

    pid = None

    def __init__(self, channel: str, key: str):
        self.exitcode: int | None = None
        self.dialed = threading.Event()
        self.conn: Any = None
        self.thread = threading.Thread(target=self._dial, args=(channel, key), daemon=True)
        self.thread.start()

    def _dial(self, channel: str, key: str) -> None:
        self.conn, _ = dial_back(channel, 0, key, timeout_s=10)
        self.dialed.set()

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self.thread.join(10)
        if self.conn is not None:
            self.conn.close()
        self.exitcode = -15

    kill = terminate

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)


def test_a_rank_that_never_dials_back_is_named_within_the_bound() -> None:
    started: list[Mapping[str, str]] = []
    handles: list[Any] = []

    def start(rank: int, environment: Mapping[str, str]) -> Any:
        started.append(environment)
        handles.append(DialingThread(environment[CHANNEL_ENV], "k") if rank == 0 else idle_process())
        return handles[-1]

    launcher = DialBackLauncher(start, authkey="k", addresses=HOSTS, dial_timeout_s=1.5)
    ranks = RankProcesses(all_reduce_rank, 2, 2, launcher=launcher)
    with pytest.raises(ChannelTimeoutError) as failed:
        ranks.start()
    channel = started[0][CHANNEL_ENV]
    assert str(failed.value) == f"trainer rank(s) [1] did not dial back to the rank channel {channel} within 1.5s"
    assert channel.startswith("127.0.0.1:")
    assert handles[0].dialed.is_set() and ranks.alive() == []  # rank 0 had its work; both are stopped
    assert handles[1].exitcode == -signal.SIGTERM
    with pytest.raises(ConnectionRefusedError):  # the channel closed with the start: nothing listens there
        socket.create_connection(parse_channel(channel), timeout=5).close()
    assert [e["RANK"] for e in started] == ["0", "1"] and [e[RANK_ADDR_ENV] for e in started] == list(HOSTS)
    assert {e["MASTER_ADDR"] for e in started} == {"127.0.0.1"} and all(e[CHANNEL_ENV] == channel for e in started)


def waiting_rank(rank: int, init_method: str, out: Any) -> None:
    """Says it is ready, then waits for ever (no group: nothing to join)."""
    out.put((rank, "ready", os.getpid()))
    threading.Event().wait()


def test_a_rank_whose_channel_ends_stops_on_its_own() -> None:
    """A dial-back rank is nobody's child: when the parent's end of its channel closes (the job process
    gone), it exits with code 3 without being signalled."""
    ranks = RankProcesses(waiting_rank, 1, launcher=DialBackLauncher.local(env=ENV, dial_timeout_s=60))
    ranks.start()
    try:
        assert ranks.out.get(timeout=60)[:2] == (0, "ready")
        ranks.out.close()
        ranks.join(30)
        assert ranks.exit_codes() == [PARENT_GONE_EXIT]
    finally:
        ranks.stop()


def test_a_wrong_key_is_refused_and_the_rank_is_named(capfd: pytest.CaptureFixture[str]) -> None:
    launcher = DialBackLauncher(
        ProcessStarter("not-the-key", env=ENV, dial_timeout_s=30), authkey="the-key", dial_timeout_s=60
    )
    ranks = RankProcesses(all_reduce_rank, 1, 1, launcher=launcher)
    with pytest.raises(ChannelError, match=r"trainer rank 0 exited with code 2 before dialing back") as failed:
        ranks.start()
    assert "with a wrong channel key" in str(failed.value)  # the refused connection, named
    assert ranks.alive() == []
    assert "refused this rank's key ($PRIMUS_RANK_CHANNEL_KEY)" in capfd.readouterr().err  # the rank's own line


def test_the_rank_side_names_the_channel_it_cannot_reach() -> None:
    with socket_port() as port:  # bound, not listening: connections are refused
        unreachable = rf"rank 3: cannot reach the rank channel 127.0.0.1:{port} within 0.5s \(ConnectionRefusedError"
        with pytest.raises(ChannelTimeoutError, match=unreachable):
            dial_back(f"127.0.0.1:{port}", 3, "k", timeout_s=0.5)


def test_a_rank_that_exits_before_dialing_back_is_named() -> None:
    def start(rank: int, environment: Mapping[str, str]) -> ProcessRank:
        return ProcessRank(subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"]))

    launcher = DialBackLauncher(start, authkey="k", dial_timeout_s=30)
    with pytest.raises(
        ChannelError, match=r"trainer rank 0 exited with code 5 before dialing back to the rank channel"
    ):
        RankProcesses(all_reduce_rank, 1, 1, launcher=launcher).start()


class socket_port:
    """A TCP port on loopback that is bound but not listening (connections to it are refused)."""

    def __enter__(self) -> int:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
