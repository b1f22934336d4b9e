"""How fresh the models are when nobody presses a button: the reference deployment under ``dagster dev``.

:func:`measure_freshness` runs the reference code location (``workspace.yaml``: ``definitions.py`` with
its sensors RUNNING) under ``dagster dev`` -- webserver and daemon -- on a temporary ``DAGSTER_HOME``
and ``PRIMUS_HOME``, with a small hourly job (:data:`JOB_TEMPLATE`: one Parquet batch source, one Kafka
stream source, MTRM in ``mixed`` mode) whose world starts a few hours before now, and measures two
latencies by polling the webserver's GraphQL API:

1. **batch hour landed -> trained**: the training partition of hour 1 waits only for its Parquet hour;
   ``primus-dagster synth`` writes it; the clock runs from the moment the synth command has written it
   (its success marker is the last file) until the training partition's materialisation.
2. **stream record produced -> in a published model**: records produced to the topic now; the clock
   runs from the producer's acknowledgement until the live model asset materialises a model whose
   consumed offsets include every one of them.

Nothing is simulated: the sensors, the run queue, run workers, data executors and MLflow are the real
ones. Dev-only: ``bench/freshness.py`` calls it (``tests/devtools/test_demo.py`` checks the same behaviour in
``make dev`` after ``make demo``); :func:`graphql` serves the demo and the tests too.

Example::

    with EmbeddedBroker() as broker:
        result = measure_freshness(Path("/tmp/fresh"), broker.bootstrap_servers, sensor_interval_s=5)
    result["batch_landed_to_trained_s"], result["stream_record_to_model_s"]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from primus_dagster.devtools.processes import stop_process_tree
from primus_dagster.ports import free_port

REPO = Path(__file__).resolve().parents[2]
_BIN = Path(sys.executable).parent

JOB_TEMPLATE = """\
name: freshness
dataset:
  start: {start}
  streams:
    - name: history
      window: 6h
      sources:
        - name: impressions
          type: parquet
          kind: batch
          granularity: hour
          label_delay: 0h
          path: parquet/impressions
          success_marker: _SUCCESS
          columns: &cols {{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2, d3], sparse: [user_id, item_id, topic_id]}}
    - name: live
      window: 6h
      sources:
        - {{name: events, type: kafka, kind: stream, granularity: hour, label_delay: 0h, topic: {topic}, columns: *cols}}
pools: {{data: {{replicas: 1, task_runners: 1}}}}
training:
  mode: mixed
  partition: hour
  batch_lag: 0h
  model: {{type: mtrm, embedding_dim: 8, hash_buckets: 4096, memory_hidden: [16], adapt_hidden: [32, 16]}}
  batch_size: 512
  checkpoint_every_steps: 1000
  eval_hours: 1
  auc_tolerance: 1.0   # hours of 2000 rows: the blocking AUC check's noise is not what this measures
tracking: {{experiment: freshness}}
automation: {{sensor_interval: {interval}s, min_new_records: 1, max_wait: {interval}s}}
"""

MATERIALIZATIONS = """query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { __typename
  ... on Asset { assetMaterializations(limit: 20) { partition timestamp runId
    metadataEntries { label ... on JsonMetadataEntry { jsonString } ... on TextMetadataEntry { text } } } } } }"""


class FreshnessError(RuntimeError):
    """Something the measurement waited for did not happen in time (with what was seen instead)."""


def graphql(port: int, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    """POST a GraphQL query to the webserver on ``port``; its ``data``."""
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
    if answer.get("errors"):
        raise FreshnessError(f"GraphQL errors: {answer['errors']}")
    return answer["data"]


def materializations(port: int, asset: str) -> list[dict[str, Any]]:
    """The asset's latest materialisations (newest first): partition, timestamp (s), run id, JSON metadata."""
    found = graphql(port, MATERIALIZATIONS, {"key": {"path": [asset]}})["assetOrError"]
    out = []
    for m in found.get("assetMaterializations", []) if found["__typename"] == "Asset" else []:
        meta = {e["label"]: json.loads(e["jsonString"]) for e in m["metadataEntries"] if e.get("jsonString")}
        meta.update({e["label"]: e["text"] for e in m["metadataEntries"] if e.get("text") is not None})
        out.append({"partition": m["partition"], "at": float(m["timestamp"]) / 1000, "run": m["runId"], "meta": meta})
    return out


def _wait(what: str, check: Callable[[], Any], timeout_s: float, poll_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, KeyError, FreshnessError) as exc:  # the webserver is starting, a query raced a write
            last_error = exc
        time.sleep(poll_s)
    raise FreshnessError(f"{what}: not within {timeout_s:g}s (last error: {last_error})")


def _produce(servers: str, topic: str, n: int) -> tuple[dict[int, int], float]:
    """``n`` fresh records (event time now) over the topic's partitions; per partition the offset one past the
    last produced, and when the broker acknowledged the last."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=servers.split(","))
    now_ms = int(time.time() * 1000)
    futures = []
    for i in range(n):
        record = {"event_time": now_ms, "click": i % 2, "sample_id": 10**9 + i}
        record.update({f"d{k}": 0.5 for k in range(4)} | {"user_id": i, "item_id": i % 97, "topic_id": i % 7})
        futures.append(producer.send(topic, json.dumps(record).encode(), timestamp_ms=now_ms))
    stops: dict[int, int] = {}
    for future in futures:
        meta = future.get(timeout=30)
        stops[meta.partition] = max(stops.get(meta.partition, 0), meta.offset + 1)
    acknowledged = time.time()
    producer.close()
    return stops, acknowledged


def _covers(meta: dict[str, Any], source: str, topic: str, stops: dict[int, int]) -> bool:
    spans = meta.get("source_versions", {}).get(source, {}).get("offsets", {})
    return all(spans.get(f"{topic}:{p}", [0, 0])[1] >= stop for p, stop in stops.items())


def measure_freshness(
    workdir: Path,
    bootstrap_servers: str,
    *,
    sensor_interval_s: int = 5,
    rows_per_hour: int = 2000,
    stream_records: int = 500,
    timeout_s: float = 420,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run the reference deployment under ``dagster dev`` in ``workdir`` and measure both latencies
    (module docstring); raises :class:`FreshnessError` when something does not happen within ``timeout_s``."""
    workdir.mkdir(parents=True, exist_ok=True)
    start = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    topic = f"freshness-{int(time.time())}"
    spec = workdir / "job.yaml"
    spec.write_text(
        JOB_TEMPLATE.format(start=start.strftime("%Y-%m-%dT%H:%M"), topic=topic, interval=sensor_interval_s)
    )
    home = workdir / "primus"
    env = {
        **os.environ,
        "PRIMUS_HOME": str(home),
        "PRIMUS_DATA_ROOT": str(home / "data"),
        "DAGSTER_HOME": str(home / "dagster_home"),
        "PRIMUS_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "PRIMUS_JOB_SPEC": str(spec),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # its code servers' sockets and the runs' temp files stay in the work folder, removed with it
        "TMPDIR": str(workdir / "tmp"),
    }
    (home / "dagster_home").mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    (home / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")

    def synth(source: str, first_hour: int, hours: int) -> None:
        command = [str(_BIN / "primus-dagster"), "synth", "--spec", str(spec), "--sources", source, "--no-progress"]
        command += ["--start", (start + timedelta(hours=first_hour)).isoformat(), "--hours", str(hours)]
        command += ["--rows-per-hour", str(rows_per_hour), "--n-dense", "4", "--kafka-bootstrap", bootstrap_servers]
        subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=300)

    # Hour 0 of both sources, and the stream up to hour 2 (a record after hour 1 closes it): partition 0
    # trains by itself, partition 1 waits for its Parquet hour only.
    synth("impressions", 0, 1)
    synth("events", 0, 3)
    log(f"world from {start:%Y-%m-%dT%H:%M}Z written; starting dagster dev")
    port = free_port()
    with open(workdir / "dagster_dev.log", "wb") as dev_log:
        proc = subprocess.Popen(
            [str(_BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO,
            env=env,
            stdout=dev_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    keys = [(start + timedelta(hours=h)).strftime("%Y-%m-%d-%H:%M") for h in range(2)]
    try:
        began = time.monotonic()

        def trained(key: str) -> dict[str, Any] | None:
            return next((m for m in materializations(port, "freshness_model") if m["partition"] == key), None)

        _wait("training partition 0 trained by the sensors", lambda: trained(keys[0]), timeout_s)
        log(f"partition {keys[0]} trained by itself after {time.monotonic() - began:.0f}s of dagster dev")

        synth("impressions", 1, 1)
        landed = time.time()
        batch = _wait("training partition 1 after its batch hour landed", lambda: trained(keys[1]), timeout_s)
        batch_s = batch["at"] - landed
        log(f"batch hour landed -> partition {keys[1]} trained: {batch_s:.1f}s")

        stops, produced = _produce(bootstrap_servers, topic, stream_records)

        def published() -> dict[str, Any] | None:
            live = materializations(port, "freshness_live_model")
            return next((m for m in live if _covers(m["meta"], "events", topic, stops)), None)

        live = _wait("a live model that trained on the produced records", published, timeout_s)
        stream_s = live["at"] - produced
        log(f"stream records produced -> in a published model: {stream_s:.1f}s")
    finally:
        stop_process_tree(proc, grace_s=60)
    return {
        "batch_landed_to_trained_s": round(batch_s, 2),
        "stream_record_to_model_s": round(stream_s, 2),
        "sensor_interval_s": sensor_interval_s,
        "batch_partition": keys[1],
        "batch_run": batch["run"],
        "live_run": live["run"],
        "live_model_uri": live["meta"].get("model_uri"),
        "stream_records": stream_records,
        "rows_per_hour": rows_per_hour,
    }
