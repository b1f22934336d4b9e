"""What every data plane offers: the :class:`DataPlane` protocol and the :class:`DataPlaneStarter` of a run.

A data plane is a data driver served over Flight plus the data executors that read its tasks:
:class:`~primus_dagster.data.DirectDataPlane` (executor processes, or threads of this process, on
this machine) and :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane` (a supervised,
possibly autoscaled executor pool: local processes or Kubernetes pods) both implement it, so the
training job, its trainer ranks and the benchmarks run on either without probing for attributes.

Example::

    def train_on(plane: DataPlane) -> dict[str, Any]:
        with plane.reader(0) as reader:
            for batch in reader:
                ...
        plane.raise_if_failed()              # DataFailedError / DataAbortedError
        pool = plane.summary()               # {"data_executors_launched": 2, "restarts": 0, "timeline": [...], ...}
        offset = plane.started_at - run_started  # the origin of the timeline's t_s, in the run's time
        return pool

    start: DataPlaneStarter = data_plane_starter(job, run_id=run_id)   # primus_dagster.cluster.backends
    with start("job.yaml", "/data", tasks, driver=driver, executors=2, trainers=1, token=token,
               kafka_bootstrap=None) as plane:
        train_on(plane)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from primus_dagster.data.driver import DataDriver
from primus_dagster.data.reader.remote_reader import RemoteReader
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import JobSpec


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
    :class:`~primus_dagster.data.DirectDataPlane`'s and
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
