"""The data executor as an OS process: command line, ``main`` and a ``Popen`` helper.

Command line::

    python -m primus_dagster.data.executor --driver grpc://127.0.0.1:7000 --executor-id data-0 \\
        --job-spec job.yaml --data-root /data [--token T | env PRIMUS_DATA_TOKEN=T] \\
        [--trainers 2] [--executor-index 0] [--host 127.0.0.1] [--port 0] [--slow-ms-per-batch 5] [--no-shm]

Once its dataset server listens, the process prints one line to stdout::

    PRIMUS_EXECUTOR_READY {"executor_id": "data-0", "address": "grpc://127.0.0.1:PORT"}

It exits 0 when the driver says the run's tasks are done and its buffers are drained, or after SIGTERM
(serving what is buffered for up to ``--drain-s``); 1 when the driver stayed unreachable.
Pass the token through the environment (``PRIMUS_DATA_TOKEN``) to keep it out of ``ps``.

Example::

    proc = start_executor_process(ExecutorConfig(driver=url, executor_id="data-0",
                                                 job_spec="job.yaml", data_root="/data"), token="s3cret")
    address = wait_ready(proc, timeout=30)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.abc
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from primus_dagster.data.driver.api import DriverAPI
from primus_dagster.data.executor.data_executor import DataExecutor
from primus_dagster.spec import JobSpec, load_job_spec

TOKEN_ENV = "PRIMUS_DATA_TOKEN"
READY_PREFIX = "PRIMUS_EXECUTOR_READY "
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
#: An executor's environment, under the caller's. An executor does no linear algebra, yet importing
#: numpy started OpenBLAS's pool of one thread per core, which spun for ~0.1 s (perf): the start-up CPU
#: per executor went from 0.44-0.45 to 0.35-0.40 s without it (two runs of six starts each, median).
#: OpenBLAS reads it once, when numpy loads: only the starter of the process can set it.
EXECUTOR_ENV = {"OPENBLAS_NUM_THREADS": "1"}


@dataclass
class ExecutorConfig:
    """Everything one executor process needs (the token travels separately, see module docstring)."""

    driver: str
    executor_id: str
    job_spec: str
    data_root: str = "."
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    executor_index: int | None = None
    trainers: int | None = None
    kafka_bootstrap: str | None = None
    slow_ms_per_batch: float = 0.0
    heartbeat_s: float | None = None
    drain_s: float = 10.0
    linger_s: float = 2.0
    log_level: str = "WARNING"
    shm: bool = True  # offer the shared-memory path to readers on this host (docs/shared_memory.md)
    fields: tuple[str, ...] | None = None  # canonical fields the trainers read (None: all; see Normalizer)

    def argv(self) -> list[str]:
        """Command-line arguments (without the token)."""
        out = [
            "--driver",
            self.driver,
            "--executor-id",
            self.executor_id,
            "--job-spec",
            self.job_spec,
            "--data-root",
            self.data_root,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--slow-ms-per-batch",
            str(self.slow_ms_per_batch),
            "--drain-s",
            str(self.drain_s),
            "--linger-s",
            str(self.linger_s),
            "--log-level",
            self.log_level,
        ]
        optional = {
            "--advertise": self.advertise,
            "--executor-index": self.executor_index,
            "--trainers": self.trainers,
            "--kafka-bootstrap": self.kafka_bootstrap,
            "--heartbeat-s": self.heartbeat_s,
            "--fields": ",".join(self.fields) if self.fields is not None else None,
        }
        for flag, value in optional.items():
            if value is not None:
                out += [flag, str(value)]
        return out if self.shm else [*out, "--no-shm"]


def parse_args(argv: Sequence[str] | None = None) -> tuple[ExecutorConfig, str | None]:
    """The config and the token (``--token`` or ``$PRIMUS_DATA_TOKEN``)."""
    p = argparse.ArgumentParser(prog="python -m primus_dagster.data.executor", description=__doc__.split("\n")[0])
    p.add_argument("--driver", required=True, help="driver Flight location, e.g. grpc://127.0.0.1:7000")
    p.add_argument("--executor-id", required=True)
    p.add_argument("--job-spec", required=True, help="JobSpec YAML path")
    p.add_argument("--data-root", default=".", help="where relative source paths resolve")
    p.add_argument("--token", default=None, help=f"shared secret (prefer ${TOKEN_ENV})")
    p.add_argument("--host", default="127.0.0.1", help="dataset server bind address")
    p.add_argument("--port", type=int, default=0, help="dataset server port (0: a free one)")
    p.add_argument("--advertise", default=None, help="host to advertise to trainers (default: --host)")
    p.add_argument("--executor-index", type=int, default=None, help="forward-shuffle index (default: from the id)")
    p.add_argument("--trainers", type=int, default=None, help="trainer count (default: pools.training.replicas)")
    p.add_argument("--kafka-bootstrap", default=None)
    p.add_argument("--slow-ms-per-batch", type=float, default=0.0, help="test/bench hook: sleep per served batch")
    p.add_argument("--heartbeat-s", type=float, default=None, help="default: data.lease / 4")
    p.add_argument("--drain-s", type=float, default=10.0, help="after SIGTERM, serve buffered batches this long")
    p.add_argument("--linger-s", type=float, default=2.0, help="wait this long for open streams to end")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument(
        "--fields",
        default=None,
        help="comma-separated canonical fields the trainers read (default: all; sample_id and ts may be left out)",
    )
    p.add_argument(
        "--no-shm",
        dest="shm",
        action="store_false",
        help="serve over Flight only (no shared-memory path for readers on this host)",
    )
    ns = p.parse_args(argv)
    token = ns.token or os.environ.get(TOKEN_ENV) or None
    values = {k: v for k, v in vars(ns).items() if k != "token"}
    if values["fields"] is not None:
        values["fields"] = tuple(f for f in values["fields"].split(",") if f)
    return ExecutorConfig(**values), token


def connect_driver(location: str, token: str | None = None) -> DriverAPI:
    """A :class:`DriverAPI` client for the driver served at ``location``."""
    from primus_dagster.data.driver.server import DriverClient

    return DriverClient(location, token=token)


def build_executor(config: ExecutorConfig, driver: DriverAPI, token: str | None = None) -> DataExecutor:
    """The in-process :class:`DataExecutor` a process with ``config`` runs."""
    job = load_job_spec(config.job_spec)
    return DataExecutor(
        driver,
        job,
        config.executor_id,
        config.data_root,
        executor_index=config.executor_index,
        trainers=config.trainers,
        token=token,
        host=config.host,
        port=config.port,
        advertise=config.advertise,
        kafka_bootstrap=config.kafka_bootstrap,
        heartbeat_s=config.heartbeat_s,
        slow_ms_per_batch=config.slow_ms_per_batch,
        shm=config.shm,
        fields=config.fields,
    )


def warm_up(job: JobSpec) -> None:
    """Import the adapters of the job's source types before announcing readiness, so the first
    task does not pay for (and steady-state measurements do not include) those imports."""
    for source_type in sorted({source.type for _, source in job.dataset.all_sources()}):
        importlib.import_module(f"primus_dagster.data.sources.{source_type}")
    without_pandas_lookup()
    pa.array(["warm-up"])  # the first conversion of Python objects (every normaliser makes some)


def without_pandas_lookup() -> None:
    """Let pyarrow's one look for pandas find none, so that it does not import pandas.

    pyarrow imports pandas (0.15-0.2 CPU-s, a quarter of an executor's start-up, measured) the first
    time it converts a Python object -- any ``pa.scalar``/``pa.array`` of Python values, which every
    normaliser makes -- only to learn whether the object is a pandas one. An executor hands it none.
    pyarrow asks once (its ``_have_pandas_internal``) and remembers the answer; an explicit use of
    pandas later (``to_pandas``) still imports it. A process that imported pandas already is left as it is.
    """
    if "pandas" in sys.modules:
        return
    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.scalar(0)  # pyarrow's lookup happens here
    finally:
        sys.meta_path.remove(blocker)


class _NoPandas(importlib.abc.MetaPathFinder):
    """An import finder under which ``import pandas`` raises ImportError."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError(f"{fullname} is not looked up in a data executor")
        return None


def use_jemalloc() -> None:
    """Allocate Arrow memory with jemalloc unless ``$ARROW_DEFAULT_MEMORY_POOL`` chose a pool.

    Arrow's default (mimalloc) gives freed pages back to the kernel at once; an executor allocates
    and frees a batch's worth of memory per batch, so it paid for faulting in and zeroing fresh
    (huge) pages over and over: 0.1-0.4 CPU-s per executor in ``bench/serve.py``, varying run to
    run. jemalloc keeps them for reuse. :func:`start_executor_process` sets the variable for the
    child, so that every allocation uses jemalloc; here, for an executor started otherwise, at
    least those made through pyarrow's Python API (reads, casts) do.
    """
    if not os.environ.get(POOL_ENV) and "jemalloc" in pa.supported_memory_backends():
        pa.set_memory_pool(pa.jemalloc_memory_pool())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one executor until the driver is done or SIGTERM; see the module docstring."""
    config, token = parse_args(argv)
    use_jemalloc()
    without_pandas_lookup()
    logging.basicConfig(
        level=config.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    executor = build_executor(config, connect_driver(config.driver, token), token)
    stop = {"requested": False}

    def on_signal(signum: int, frame: Any) -> None:  # only a flag: the main loop does the work
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    warm_up(executor.job)
    gc.freeze()  # imports are permanent: keep the collector from re-scanning them while serving
    executor.start()
    print(READY_PREFIX + json.dumps({"executor_id": config.executor_id, "address": executor.location}), flush=True)
    while not executor.finished() and not stop["requested"] and executor.fatal is None:
        time.sleep(0.05)
    executor.close(drain_s=config.drain_s if stop["requested"] else 0.0, linger_s=config.linger_s)
    if executor.fatal:
        logging.getLogger(__name__).error("%s: %s", config.executor_id, executor.fatal)
        return 1
    return 0


def start_executor_process(
    config: ExecutorConfig,
    token: str | None = None,
    *,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    stderr: Any = None,
    cwd: str | None = None,
) -> subprocess.Popen[str]:
    """Start ``python -m primus_dagster.data.executor`` with ``config``; stdout is a pipe
    (read the ready line with :func:`wait_ready`), the token goes through the environment."""
    child_env = {**EXECUTOR_ENV, **(os.environ if env is None else env)}
    if "jemalloc" in pa.supported_memory_backends():
        child_env.setdefault(POOL_ENV, "jemalloc")  # see use_jemalloc
    if token:
        child_env[TOKEN_ENV] = token
    else:
        child_env.pop(TOKEN_ENV, None)
    return subprocess.Popen(
        [python, "-m", "primus_dagster.data.executor", *config.argv()],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=cwd,
        text=True,
    )


def wait_ready(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The dataset-server address an executor process announced; RuntimeError if it exited first."""
    import selectors

    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, min(0.5, deadline - time.monotonic()))):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(READY_PREFIX):
                return str(json.loads(line[len(READY_PREFIX) :])["address"])
    code = proc.poll()
    raise RuntimeError(f"executor process {proc.pid} did not become ready in {timeout:g}s (exit code {code})")
