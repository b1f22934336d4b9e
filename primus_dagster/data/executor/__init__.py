"""Data executors: task runners that read tasks, per-trainer buffers and the Flight dataset server.

* :class:`DataExecutor` (:mod:`.data_executor`) -- leases tasks, reads them, buffers their batches;
* :class:`DatasetServer` (:mod:`.dataset_server`) -- its Flight ``DoGet`` server (protocol:
  ``primus_dagster.data.flight_protocol``, shared memory: ``primus_dagster.data.shm``);
* ``python -m primus_dagster.data.executor`` / :func:`start_executor_process` (:mod:`.process`)
  -- an executor as an OS process.

Example::

    with DataExecutor(driver, job, "data-0", data_root="/data") as executor:
        executor.wait()
"""

from primus_dagster.data.executor.buffers import TrainerBuffers
from primus_dagster.data.executor.data_executor import DataExecutor
from primus_dagster.data.executor.dataset_server import DatasetServer
from primus_dagster.data.executor.process import (
    EXECUTOR_ENV,
    READY_PREFIX,
    TOKEN_ENV,
    ExecutorConfig,
    build_executor,
    connect_driver,
    main,
    start_executor_process,
    wait_ready,
)

__all__ = [
    "EXECUTOR_ENV",
    "READY_PREFIX",
    "TOKEN_ENV",
    "DataExecutor",
    "DatasetServer",
    "ExecutorConfig",
    "TrainerBuffers",
    "build_executor",
    "connect_driver",
    "main",
    "start_executor_process",
    "wait_ready",
]
