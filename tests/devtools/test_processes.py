"""stop_process_tree: a server's own group and a descendant in a session of its own both stop."""

from __future__ import annotations

import subprocess
import time

import psutil

from primus_dagster.devtools.processes import stop_process_tree


def test_a_descendant_outside_the_process_group_is_stopped_too() -> None:
    # `setsid sleep` is a descendant in a session of its own: SIGTERM to the group does not reach it.
    proc = subprocess.Popen(["bash", "-c", "setsid sleep 120 & sleep 120"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(psutil.Process(proc.pid).children(recursive=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) == 2 and len({c.pid for c in children}) == 2
    stop_process_tree(proc, grace_s=5, straggler_grace_s=2)
    assert proc.returncode is not None
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, alive
