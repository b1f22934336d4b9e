"""The engine's log lines (planning, executors, phases, checkpoints, evaluation, heartbeats) in the Dagster run log.

The engine logs through the ``primus_dagster`` loggers (the CLI prints them on stderr). Inside an
asset, :func:`engine_logs_to` forwards their INFO and higher records to ``context.log`` for the
duration of the block, so the run's page in the Dagster UI tells what the run is doing at every
stage -- without the instance having to manage Python loggers (``python_logs``).

Example::

    with engine_logs_to(context.log):
        result = train_window(...)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

ENGINE_LOGGER = "primus_dagster"


class _Forward(logging.Handler):
    def __init__(self, target: logging.Logger | logging.LoggerAdapter) -> None:
        super().__init__(logging.INFO)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.target.log(record.levelno, record.getMessage())
        except Exception:  # a log line must never fail the run
            self.handleError(record)


@contextmanager
def engine_logs_to(target: logging.Logger | logging.LoggerAdapter) -> Iterator[None]:
    """Forward the ``primus_dagster`` loggers' INFO+ records to ``target`` (``context.log``) inside the block;
    the logger's level is INFO meanwhile and restored afterwards."""
    logger = logging.getLogger(ENGINE_LOGGER)
    handler = _Forward(target)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
