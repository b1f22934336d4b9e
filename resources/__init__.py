"""Reference code location: the resources, on embedded defaults unless the environment says otherwise.

``storage``: data root ``$PRIMUS_DATA_ROOT`` (else ``$PRIMUS_HOME/data``) with its nested ``kafka``:
``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``, else the embedded broker started by ``primus-dagster-dev broker
--detach``; ``mlflow``: ``$MLFLOW_TRACKING_URI``, else the spec's, else SQLite under ``$PRIMUS_HOME``;
``executor_pool``: local processes. Variables that are set go in as ``EnvVar``.

``EXECUTOR``: how a run executes its steps, chosen by ``$PRIMUS_DEPLOYMENT`` (``local``, the default: a
run's steps one after another in its run worker; ``kubernetes``: each step a Kubernetes Job); see
``primus_dagster.dagster_defs.executors``.

Example::

    RESOURCES = {**default_resources(), "executor_pool": ExecutorPoolResource(data_executors=4)}
"""

from primus_dagster.dagster_defs import default_resources, deployment_executor

RESOURCES = default_resources()
EXECUTOR = deployment_executor()
