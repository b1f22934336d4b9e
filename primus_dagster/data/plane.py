"""What every data plane offers: the :class:`DataPlane` protocol and the :class:`DataPlaneStarter` of a run.

A data plane is a data driver served over Flight plus the data executors that read its tasks:
:class:`~primus_dagster.data.InTrainerDataPlane` (the executors as threads of the trainer's process)
and :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane` (a supervised, possibly autoscaled
executor pool: local processes or Kubernetes pods) both implement it, so the training job, its trainer
ranks and the benchmarks run on either without probing for attributes. Both are built on
:class:`DataPlaneBase` (the driver half: spec, driver server, readers).

Example::

    def train_on(plane: DataPlane) -> dict[str, Any]:
        with plane.reader(0) as reader:
            for batch in reader:
                ...
        plane.raise_if_failed()              # DataFailedError / DataAbortedError
        pool = plane.summary()               # {"data_executors_launched": 2, "restarts": 0, "timeline": [...], ...}
        plane.readers()                      # {0: <RemoteReader>}: the latest reader of each trainer
        offset = plane.started_at - run_started  # the origin of the timeline's t_s, in the run's time
        return pool

    start: DataPlaneStarter = data_plane_starter(job, run_id=run_id)   # primus_dagster.cluster.backends
    with start("job.yaml", "/data", tasks, driver=driver, executors=2, trainers=1, token=token,
               kafka_bootstrap=None) as plane:
        train_on(plane)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from primus_dagster.data.canonical import check_fields
from primus_dagster.data.driver import DataDriver, DriverClient, DriverServer
from primus_dagster.data.reader.remote_reader import RemoteReader
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import JobSpec, load_job_spec


@runtime_checkable
class DataPlane(Protocol):
    """A run's data plane: the driver (served at ``location``) and its data executors.

    Read-only members (plain attributes or properties in the implementations):

    * ``location`` -- the driver's Flight address (``grpc://host:port``), what trainers elsewhere dial;
    * ``driver`` -- the :class:`~primus_dagster.data.DataDriver` (task table, ledgers, barriers);
    * ``token`` -- the Flight bearer token of the driver and executors (None: no auth);
    * ``trainers`` -- how many trainers (reader ids ``0 .. trainers - 1``) it serves;
    * ``job`` -- the job spec it was started with;
    * ``started_at`` -- ``time.monotonic()`` when its executors were started (set by ``__enter__``;
      before, when the plane was made): the origin of the ``t_s`` of its summary's ``timeline``.

    ``isinstance(obj, DataPlane)`` checks that these members exist (not their types).
    """

    @property
    def location(self) -> str: ...

    @property
    def driver(self) -> DataDriver: ...

    @property
    def token(self) -> str | None: ...

    @property
    def trainers(self) -> int: ...

    @property
    def job(self) -> JobSpec: ...

    @property
    def started_at(self) -> float: ...

    def reader(self, trainer_id: int, *, in_process: bool = True, **kwargs: Any) -> RemoteReader:
        """A trainer-side reader of trainer ``trainer_id``'s batches (``in_process``: it calls the
        driver object directly, else through its own Flight client); ``kwargs`` go to
        :class:`~primus_dagster.data.RemoteReader`."""
        ...

    def readers(self) -> dict[int, RemoteReader]:
        """The latest reader :meth:`reader` made for each trainer in this process, by trainer id (what
        the autoscaler samples the trainers' wait on its queues from)."""
        ...

    def summary(self) -> dict[str, Any]:
        """What its executors did (JSON-able): at least ``data_executors_launched``,
        ``data_executors_running``, ``restarts``, ``cpu_seconds``, ``error`` (the plane's own failure
        that aborted the run's tasks, e.g. an executor out of restarts; else None),
        ``scaling`` (the autoscaler's summary, or None) and ``timeline`` (scaling ticks, ``t_s``
        relative to ``started_at``; empty without an autoscaler)."""
        ...

    def raise_if_failed(self) -> None:
        """Raise :class:`~primus_dagster.data.DataFailedError` / :class:`~primus_dagster.data.DataAbortedError`
        when the run's tasks failed."""
        ...

    def cpu_seconds(self) -> float:
        """CPU seconds its executor processes used so far (0 where they are not processes it can measure)."""
        ...

    def close(self) -> None:
        """Stop the executors and the driver server (idempotent)."""
        ...

    def __enter__(self) -> DataPlane: ...

    def __exit__(self, *exc: object) -> None: ...


class DataPlaneStarter(Protocol):
    """What starts a run's data plane (not yet entered: use it in a ``with``):
    :class:`~primus_dagster.data.InTrainerDataPlane`'s and
    :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane`'s common signature; see
    :func:`primus_dagster.cluster.backends.data_plane_starter`."""

    def __call__(
        self,
        job_path: str | Path,
        data_root: str | Path,
        tasks: Iterable[DataTask] = (),
        *,
        driver: DataDriver | None,
        executors: int,
        trainers: int,
        token: str | None,
        kafka_bootstrap: str | None,
    ) -> DataPlane: ...


class DataPlaneBase:
    """The driver half every data plane shares: the job spec, the
    :class:`~primus_dagster.data.DataDriver` (``tasks`` added) served over Flight on ``driver_host`` at
    :attr:`location`, the trainer-side readers (:meth:`reader`, :meth:`readers`) and
    :meth:`raise_if_failed`. A plane built on it starts and stops its executors (``__enter__`` serves
    the driver with ``self.server.serve_in_thread()`` and sets ``started_at``; ``close``) and says what
    they did (``summary``, ``cpu_seconds``).

    ``fields``: the canonical fields the trainers read (None: all; checked, kept sorted), the only ones
    its executors decode; ``heartbeat_s``: their heartbeat period (default: a quarter of the lease).

    Example::

        class OneThreadPlane(DataPlaneBase):
            def __enter__(self) -> OneThreadPlane:
                self.server.serve_in_thread()
                self.started_at = time.monotonic()
                ...                                  # start the executors
                return self
    """

    def __init__(
        self,
        job_path: str | Path,
        data_root: str | Path,
        tasks: Iterable[DataTask] = (),
        *,
        trainers: int = 1,
        token: str | None = None,
        kafka_bootstrap: str | None = None,
        driver: DataDriver | None = None,
        heartbeat_s: float | None = None,
        fields: Sequence[str] | None = None,
        driver_host: str = "127.0.0.1",
    ):
        self.job_path = str(job_path)
        self.job: JobSpec = load_job_spec(job_path)
        self.data_root = str(data_root)
        self.token = token
        self.kafka_bootstrap = kafka_bootstrap
        self.trainers = trainers
        self.heartbeat_s = heartbeat_s
        chosen = check_fields(fields)
        self.fields = tuple(sorted(chosen)) if chosen is not None else None
        self.driver = driver or DataDriver.for_job(self.job.data, trainers=trainers)
        self.driver.add_tasks(tasks)
        self.server = DriverServer(self.driver, host=driver_host, token=token)
        self.started_at = time.monotonic()  # when its executors were started (__enter__ sets it)
        self._readers: dict[int, RemoteReader] = {}
        self._readers_lock = threading.Lock()

    @property
    def location(self) -> str:
        """The driver's Flight address."""
        return self.server.location

    def reader(self, trainer_id: int, *, in_process: bool = True, **kwargs: Any) -> RemoteReader:
        """A trainer-side reader (see :func:`reader_for`); kept for :meth:`readers`."""
        reader = reader_for(self.driver, self.location, trainer_id, token=self.token, in_process=in_process, **kwargs)
        with self._readers_lock:
            self._readers[trainer_id] = reader
        return reader

    def readers(self) -> dict[int, RemoteReader]:
        """The latest reader of each trainer made by :meth:`reader` in this process (the autoscaler
        measures the trainers' wait on their queues)."""
        with self._readers_lock:
            return dict(self._readers)

    def raise_if_failed(self) -> None:
        """The failure of the run's tasks (failed tasks past the threshold, or an abort), raised."""
        self.driver.raise_if_failed()

    def close(self) -> None:
        """Stop the executors and the driver server (idempotent): the plane's own."""
        raise NotImplementedError

    def __exit__(self, *exc: object) -> None:
        self.close()


def reader_for(
    driver: DataDriver, location: str, trainer_id: int, *, token: str | None, in_process: bool = True, **kwargs: Any
) -> RemoteReader:
    """A trainer-side reader of the driver ``driver`` served at ``location``. ``in_process``: it calls
    the driver object directly (claims and barriers without an RPC, as a trainer co-located with its
    driver does); otherwise through its own Flight client (closed with the reader), as a trainer
    elsewhere would."""
    if in_process:
        return RemoteReader(driver, trainer_id, token=token, **kwargs)
    client = DriverClient(location, token=token)
    reader = RemoteReader(client, trainer_id, token=token, **kwargs)
    original_close = reader.close

    def close() -> None:
        original_close()
        client.close()

    reader.close = close  # type: ignore[method-assign]
    return reader
