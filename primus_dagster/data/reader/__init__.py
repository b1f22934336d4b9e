"""The trainer side of the data plane: Flight (or shared-memory) streams from the data
executors into per-kind queues, claimed exactly once at the driver.

* :class:`RemoteReader` (:mod:`.remote_reader`) -- fetching, claiming, queueing, barriers;
* :class:`QueueStat`, :func:`batch_first`, :class:`RoundRobin` (:mod:`.queue_policy`) -- which
  queue the trainer takes its next batch from.
"""

from primus_dagster.data.reader.queue_policy import ChooseQueue, QueueStat, RoundRobin, batch_first
from primus_dagster.data.reader.remote_reader import RemoteReader

__all__ = ["ChooseQueue", "QueueStat", "RemoteReader", "RoundRobin", "batch_first"]
