"""Stopping a server started in its own session (``dagster dev``, ``dagster-webserver``, ``mlflow server``)
together with everything it started.

SIGTERM to the process group first; what is still alive once the server has exited -- a code server
that waits for a heartbeat timeout before it goes, a grandchild in a session of its own -- gets SIGTERM
and then SIGKILL, so that nothing outlives the caller's ``with`` block.

Example::

    proc = subprocess.Popen(["dagster", "dev", ...], start_new_session=True)
    ...
    stop_process_tree(proc)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil

__all__ = ["stop_process_tree"]


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_process_tree(proc: subprocess.Popen, grace_s: float = 30.0, straggler_grace_s: float = 5.0) -> None:
    """Stop ``proc`` (started with ``start_new_session=True``) and all its descendants: SIGTERM to its
    process group, ``grace_s`` for it to exit, SIGKILL if it does not; then SIGTERM and, after
    ``straggler_grace_s``, SIGKILL to every descendant still alive."""
    descendants = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    alive = [p for p in descendants if _running(p)]
    for child in alive:
        try:
            child.terminate()
        except psutil.Error:
            continue
    _, still = psutil.wait_procs(alive, timeout=straggler_grace_s)
    for child in still:
        try:
            child.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(still, timeout=straggler_grace_s)
