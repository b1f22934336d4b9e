"""Shared-memory fast path between a data executor and the readers on its host.

Both sides of one protocol (``docs/shared_memory.md``): the executor writes batches into slot
files (:mod:`.slots`), a reader on the same host maps them zero-copy (:mod:`.slot_reader`).
"""

from primus_dagster.data.shm.slot_reader import ShmClient, ShmError, connect_shm, is_local
from primus_dagster.data.shm.slots import (
    SHM_ACTION,
    SHM_DIR_ENV,
    SHM_ENV,
    ShmDir,
    SlotPool,
    shm_enabled,
    sweep_dead_executors,
    sweep_stale,
)

__all__ = [
    "SHM_ACTION",
    "SHM_DIR_ENV",
    "SHM_ENV",
    "ShmClient",
    "ShmDir",
    "ShmError",
    "SlotPool",
    "connect_shm",
    "is_local",
    "shm_enabled",
    "sweep_dead_executors",
    "sweep_stale",
]
