"""Data executors: task runners that read tasks, per-trainer buffers and the Flight dataset server.

* :class:`DataExecutor` -- the in-process executor (``core``);
* :class:`DatasetServer` -- its Flight ``DoGet`` server (``server``), wire format in ``wire``;
* ``python -m primus_dagster.data.executor`` / :func:`start_executor_process` -- as an OS process.

Example::

    with DataExecutor(driver, job, "data-0", data_root="/data") as executor:
        executor.wait()
"""

from primus_dagster.data.executor.buffers import TrainerBuffers
from primus_dagster.data.executor.core import DataExecutor, Item
from primus_dagster.data.executor.process import (
    READY_PREFIX,
    TOKEN_ENV,
    ExecutorConfig,
    build_executor,
    connect_driver,
    main,
    start_executor_process,
    wait_ready,
)
from primus_dagster.data.executor.server import DatasetServer
from primus_dagster.data.executor.wire import BatchMeta, decode_ticket, encode_ticket, from_wire, to_wire
from primus_dagster.data.flight_auth import bearer_options

__all__ = [
    "READY_PREFIX",
    "TOKEN_ENV",
    "BatchMeta",
    "DataExecutor",
    "DatasetServer",
    "ExecutorConfig",
    "Item",
    "TrainerBuffers",
    "bearer_options",
    "build_executor",
    "connect_driver",
    "decode_ticket",
    "encode_ticket",
    "from_wire",
    "main",
    "start_executor_process",
    "to_wire",
    "wait_ready",
]
