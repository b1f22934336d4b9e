"""End to end, nobody pressing a button: the reference deployment under ``dagster dev`` (webserver and
daemon, its sensors RUNNING) on a temporary ``DAGSTER_HOME``, driven only by data landing.

``primus-dagster synth`` writes the batch hour the next training partition waits for -> the partition
materialises by itself; records produced to the Kafka topic -> a live model that trained on them is
published (polled through the webserver's GraphQL API; :mod:`primus_dagster.devtools.freshness`, which
``bench/freshness.py`` times). About two minutes on 2 cores.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from primus_dagster.devtools.freshness import measure_freshness

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)  # measure_freshness bounds itself (420 s); 2-4 min on 2 shared cores
def test_new_data_is_trained_and_published_by_the_sensors_alone(tmp_path: Path, kafka_broker) -> None:
    began = time.monotonic()
    result = measure_freshness(
        tmp_path,
        kafka_broker.bootstrap_servers,
        sensor_interval_s=5,
        timeout_s=420,
        log=lambda line: print(f"[{time.monotonic() - began:5.0f}s] {line}"),  # shown with a failure
    )
    assert result["batch_run"] and result["live_run"] and result["live_run"] != result["batch_run"]
    assert result["live_model_uri"].startswith("models:/")
    assert result["batch_landed_to_trained_s"] > 0 and result["stream_record_to_model_s"] > 0
