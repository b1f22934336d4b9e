"""Freshness of the models under automation: the reference deployment in ``dagster dev``, nobody pressing a button.

Real services end to end (:mod:`primus_dagster.devtools.freshness`): the embedded Kafka-compatible
broker, ``dagster dev`` (webserver + daemon) on the reference code location with its sensors
RUNNING, a temporary ``DAGSTER_HOME`` / ``PRIMUS_HOME``, MLflow on SQLite, data executor processes.
The job (``devtools.freshness.JOB_TEMPLATE``) trains MTRM hourly in ``mixed`` mode on one Parquet
batch source and one Kafka stream source, with ``automation.sensor_interval`` = ``--sensor-interval``
and ``min_new_records: 1``.

- ``batch_landed_to_trained_s``: ``primus-dagster synth`` writes the Parquet hour the next training
  partition waits for -> that partition is materialised (batch sensor -> source run with its checks
  -> training run warm-started from the partition before). Goal <= 120 s.
- ``stream_record_to_model_s``: records produced to the topic (acknowledged) -> the live model asset
  materialises a model whose consumed Kafka offsets include all of them (stream sensor -> live
  increment: the newest model trained on the tail, published to MLflow). Goal <= 60 s.
- ``sensor_interval_s``: the sensors' minimum interval. The daemon evaluates sensors on its own loop,
  so a tick can come a few seconds later than the interval.

One measurement per run (each is a few minutes of wall time on 2 cores: ``dagster dev`` start-up and
the first partitions trained by themselves come first); ``--repeat`` runs it again in a fresh home.

Run: ``python bench/freshness.py [--sensor-interval 5] [--repeat 1]``; prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from primus_dagster.devtools.freshness import measure_freshness
from primus_dagster.devtools.kafka_broker import EmbeddedBroker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sensor-interval", type=int, default=5, help="automation.sensor_interval in seconds")
    parser.add_argument("--rows-per-hour", type=int, default=2000)
    parser.add_argument("--stream-records", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    runs = []
    began = time.monotonic()
    with EmbeddedBroker() as broker:
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="primus-freshness-") as tmp:
                run = measure_freshness(
                    Path(tmp),
                    broker.bootstrap_servers,
                    sensor_interval_s=args.sensor_interval,
                    rows_per_hour=args.rows_per_hour,
                    stream_records=args.stream_records,
                    log=lambda line: print(f"[{time.monotonic() - began:6.1f}s] {line}", flush=True),
                )
            print(f"run {i + 1}: {json.dumps(run)}", flush=True)
            runs.append(run)
    batch = [r["batch_landed_to_trained_s"] for r in runs]
    stream = [r["stream_record_to_model_s"] for r in runs]
    result = {
        "bench": "freshness",
        "batch_landed_to_trained_s": round(statistics.median(batch), 2),
        "stream_record_to_model_s": round(statistics.median(stream), 2),
        "sensor_interval_s": args.sensor_interval,
        "repeats": args.repeat,
        "batch_landed_to_trained_all_s": batch,
        "stream_record_to_model_all_s": stream,
        "rows_per_hour": args.rows_per_hour,
        "stream_records": args.stream_records,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
