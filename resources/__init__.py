"""Reference deployment: resources on embedded defaults.

Data root: ``$PRIMUS_DATA_ROOT`` or ``./.primus/data``; Kafka: ``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``
or the embedded broker started by ``primus-dagster broker --detach``.
"""

from primus_dagster.dagster_defs import default_resources

RESOURCES = default_resources()
