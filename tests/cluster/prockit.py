"""Process-table checks for the pool tests: nothing a run started may outlive it.

Imported as ``tests.cluster.prockit``. A run is recognised by a token unique to it that every one
of its processes carries on its command line (the job spec path under the test's ``tmp_path``);
"children" are this test process's descendants that were not there before the run.

Example::

    before = child_pids()
    with PooledDataPlane(spec, ...) as plane:
        ...
    assert_no_orphans(str(spec), before)
"""

from __future__ import annotations

import time

import psutil


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def child_pids() -> set[int]:
    """Live descendants of this process now."""
    return {p.pid for p in psutil.Process().children(recursive=True) if _alive(p)}


def processes_with(token: str) -> list[psutil.Process]:
    """Live processes (any parent) whose command line holds ``token``, this one excepted."""
    me = psutil.Process().pid
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid != me and any(token in part for part in cmdline) and _alive(proc):
            found.append(proc)
    return found


def leftovers(token: str, children_before: set[int]) -> list[str]:
    """What is left of a run: its token's processes and this process's new descendants."""
    procs = {p.pid: p for p in processes_with(token)}
    for child in psutil.Process().children(recursive=True):
        if child.pid not in children_before and _alive(child):
            procs[child.pid] = child
    out = []
    for pid, proc in sorted(procs.items()):
        try:
            out.append(f"{pid}: {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            continue
    return out


def assert_no_orphans(token: str, children_before: set[int], timeout: float = 20.0) -> None:
    """Poll (up to ``timeout``: a process may still be exiting) until nothing of the run is left."""
    deadline = time.monotonic() + timeout
    left = leftovers(token, children_before)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(token, children_before)
    assert not left, f"processes outlived the run: {left}"
