"""Live stream increments: where an increment starts (pure) and increments on a real broker.

The integration tests train a base window, then increments on the Kafka tail of the embedded broker:
each record after the base's end is trained exactly once along the chain, nothing new → no run, a
killed increment resumes with exactly the records it was planned with.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from jobkit import make_job

from primus_dagster import cli
from primus_dagster.data.sources import make_adapter
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.training.live import (
    LiveIncrement,
    NotLiveError,
    TrainedRun,
    choose_start,
    live_sources,
    run_live_increment,
)
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.tracking import MlflowTracker
from primus_dagster.training.window import train_window

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _offsets_at(moment: datetime) -> dict[str, dict[int, int]]:
    return {"events": {0: int(moment.timestamp()) % 1000, 1: 7}}


def test_an_increment_continues_the_newest_increment_built_on_the_same_base() -> None:
    base = TrainedRun("job/2026-11-01", window_end=T0)
    head = TrainedRun("job/live/abc", base_key="job/2026-11-01", stops={"events": {0: 50, 1: 60}})
    start = choose_start(base, head, _offsets_at)
    assert (start.warm_start, start.base_key, start.committed) == ("job/live/abc", "job/2026-11-01", head.stops)


def test_a_newer_window_rebases_the_chain_from_the_window_end() -> None:
    base = TrainedRun("job/2026-11-02", window_end=T0 + timedelta(days=1))
    head = TrainedRun("job/live/abc", base_key="job/2026-11-01", stops={"events": {0: 50}})
    start = choose_start(base, head, _offsets_at)
    assert start.warm_start == "job/2026-11-02"
    assert start.committed == _offsets_at(T0 + timedelta(days=1))
    assert "builds on window job/2026-11-02" in start.why


def test_without_a_trained_model_an_increment_starts_fresh_from_the_first_offsets() -> None:
    start = choose_start(None, None, _offsets_at)
    assert (start.warm_start, start.base_key, start.committed) == (None, None, {})
    headless = choose_start(None, TrainedRun("job/live/x", base_key=None, stops={"events": {0: 9}}), _offsets_at)
    assert headless.committed == {"events": {0: 9}}  # an increment chain without a base continues itself


def test_run_keys_follow_where_an_increment_starts(tmp_path: Path) -> None:
    job = load_job_spec(make_job(tmp_path, hours=0)["job_path"])
    a = choose_start(TrainedRun("k", window_end=T0), None, _offsets_at)
    assert a.run_key(job) == choose_start(TrainedRun("k", window_end=T0), None, _offsets_at).run_key(job)
    assert a.run_key(job) != choose_start(
        TrainedRun("k", window_end=T0 + timedelta(hours=1)), None, _offsets_at
    ).run_key(job)


def test_a_job_without_a_kafka_stream_cannot_follow_one(tmp_path: Path) -> None:
    env = make_job(tmp_path, hours=0)  # the stream source is Parquet
    with pytest.raises(NotLiveError, match="no Kafka source of kind stream"):
        live_sources(env["job"])
    batch = make_job(tmp_path / "b", hours=0, mode="batch", model="single", kafka="127.0.0.1:1")
    with pytest.raises(NotLiveError, match="batch"):
        live_sources(batch["job"])


def _kafka_ids(env: dict, since: datetime) -> Counter:
    """Sample ids of the Kafka records with an event time at or after ``since``, read through the adapter."""
    source = env["job"].dataset.source("events")
    out: Counter = Counter()
    with make_adapter(source, env["context"]) as adapter:
        for task in adapter.tail({p: o for p, o in adapter.offsets_at(since).items()}).tasks:
            for batch in adapter.read(task):
                out.update(batch.column("sample_id").to_pylist())
    return out


def _increment(env: dict, tracker: MlflowTracker, seen: list[int], fail_after: int | None = None):
    def on_batch(step: int, batch, trainer: int) -> None:
        seen.extend(batch.sample_id.tolist())
        if fail_after is not None and len(seen) >= fail_after:
            raise RuntimeError("injected trainer crash")

    cfg = LiveIncrement(env["job"], env["job_path"], env["root"], kafka_bootstrap=env["kafka"], tracker=tracker)
    return run_live_increment(cfg, RunHooks(on_batch=on_batch))


@pytest.mark.integration
def test_increments_train_each_stream_record_after_the_base_once(tmp_path: Path, kafka_broker, capsys) -> None:
    env = make_job(
        tmp_path, kafka=kafka_broker.bootstrap_servers, topic="live-chain", hours=2, every=4, rows_per_hour=1000
    )
    tracker = MlflowTracker(env["job"].tracking.tracking_uri, env["job"].tracking.experiment)
    base = train_window(
        TrainingRequest(
            env["job"], env["job_path"], env["root"], env["window"], kafka_bootstrap=env["kafka"], evaluate=False
        )
    )
    first: list[int] = []
    one = _increment(env, tracker, first)
    assert one.start.base_key == base_key(env) and one.training is not None
    assert one.training.warm_started_from == base.run_id
    expected = _kafka_ids(env, env["window"].end)  # the 2 hours after the base window
    assert Counter(first) == expected and one.records == sum(expected.values())

    nothing = _increment(env, tracker, [])
    assert (nothing.records, nothing.training) == (0, None)

    world = SyntheticWorld(WorldConfig(seed=6, rows_per_hour=600, n_dense=5), env["job"].dataset.start)
    write_world(env["job"], env["context"], world, range(4, 5), sources=["events"], progress=False)
    more: list[int] = []
    two = _increment(env, tracker, more)
    assert two.start.warm_start == one.run_key and "continues increment" in two.start.why
    assert Counter(first) + Counter(more) == _kafka_ids(env, env["window"].end)  # each record once along the chain

    # The command line continues the same chain: nothing new since the last increment.
    argv = ["live", str(env["job_path"]), "--data-root", str(env["root"]), "--kafka-bootstrap", env["kafka"], "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["new_records"] == 0 and report["live_start"] == f"continues increment {two.run_key}"


def base_key(env: dict) -> str:
    return f"{env['job'].name}/{env['window'].start:%Y-%m-%dT%H}/{env['window'].end:%Y-%m-%dT%H}"


@pytest.mark.integration
def test_a_crashed_increment_resumes_with_exactly_its_planned_records(tmp_path: Path, kafka_broker) -> None:
    env = make_job(
        tmp_path, kafka=kafka_broker.bootstrap_servers, topic="live-crash", hours=1, every=3, rows_per_hour=1500
    )
    tracker = MlflowTracker(env["job"].tracking.tracking_uri, env["job"].tracking.experiment)
    crashed: list[int] = []
    with pytest.raises(RuntimeError, match="injected trainer crash"):
        _increment(env, tracker, crashed, fail_after=2000)  # no base: a fresh model from the first offsets
    planned = _kafka_ids(env, datetime(1970, 1, 2, tzinfo=timezone.utc))
    world = SyntheticWorld(WorldConfig(seed=7, rows_per_hour=500, n_dense=5), env["job"].dataset.start)
    write_world(env["job"], env["context"], world, range(3, 4), sources=["events"], progress=False)  # arrives meanwhile

    resumed: list[int] = []
    result = _increment(env, tracker, resumed)
    assert result.training is not None and result.training.resumed_from_step is not None
    assert result.records == sum(planned.values())  # the killed attempt's stops, not the new high watermarks
    assert result.training.stats["samples"] == sum(planned.values())  # checkpointed + resumed: each once
    assert not Counter(resumed) - planned and max(Counter(resumed).values()) == 1

    later: list[int] = []
    _increment(env, tracker, later)  # the records produced meanwhile come next
    assert Counter(later) == _kafka_ids(env, datetime(1970, 1, 2, tzinfo=timezone.utc)) - planned
