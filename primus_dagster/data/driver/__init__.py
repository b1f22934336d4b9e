"""The central data driver: task table, leases, exactly-once claim ledger, barriers, snapshots,
served over Arrow Flight actions (contract: ``docs/data_plane.md``).

Example::

    from primus_dagster.data.driver import DataDriver, DriverClient, DriverServer

    server = DriverServer(DataDriver(lease_s=30)).serve_in_thread()
    client = DriverClient(server.location)   # the same DriverAPI as the DataDriver itself
"""

from primus_dagster.data.driver.api import Completion, DriverAPI, ExecutorReport, Lease, MemberFailure
from primus_dagster.data.driver.client import DriverClient, DriverUnavailableError
from primus_dagster.data.driver.server import DriverServer
from primus_dagster.data.driver.state import DataDriver
from primus_dagster.data.driver.task_record import DataAbortedError, DataFailedError

__all__ = [
    "Completion",
    "DataAbortedError",
    "DataDriver",
    "DataFailedError",
    "DriverAPI",
    "DriverClient",
    "DriverServer",
    "DriverUnavailableError",
    "ExecutorReport",
    "Lease",
    "MemberFailure",
]
