"""DTGG planner on real Parquet directory trees: tasks, order, cache on slide, readiness, joins, threads."""

from __future__ import annotations

import threading
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from primus_dagster.data.graph import ListingCache, Planner, TaskBlock
from primus_dagster.data.sources import ReadTask, SourceContext, TimeWindow, make_adapter
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import DatasetSpec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
H = timedelta(hours=1)
COLUMNS = {"ts": "event_time", "label": "click", "id": "sample_id", "dense": ["d0"]}


def write_tree(root: Path, rel: str, hours: range, files: int = 3, marker: bool = True) -> None:
    """Hive hours of fake Parquet files (listing never opens them); sizes differ per file."""
    for h in hours:
        when = T0 + h * H
        directory = root / rel / f"dt={when:%Y-%m-%d}" / f"hour={when:%H}"
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            (directory / f"part-{i:05d}.parquet").write_bytes(b"x" * (10 + i + h))
        if marker:
            (directory / "_SUCCESS").touch()


def two_streams(join: dict | None = None, **extra) -> DatasetSpec:
    def src(name: str, path: str) -> dict:
        return {"name": name, "type": "parquet", "path": path, "columns": COLUMNS}

    second = {"name": "fresh", "sources": [src("imp_f", "imp")]}
    first = {"name": "history", "sources": [src("imp_h", "imp"), src("clk_h", "clk")]}
    if join:
        first["join"] = join
    return DatasetSpec.model_validate({"start": "2026-11-01", "streams": [first, second], **extra})


class Spy:
    """An adapter factory that counts listing calls and records the threads they ran on."""

    def __init__(self, delay: float = 0.0):
        self.calls: list[tuple[str, datetime]] = []
        self.threads: set[str] = set()
        self.delay, self.active, self.peak = delay, 0, 0
        self.lock = threading.Lock()

    def __call__(self, spec, context):
        adapter = make_adapter(spec, context)
        inner, spy = adapter.partitions, self

        def partitions(window: TimeWindow):
            with spy.lock:
                spy.calls.append((spec.path, window.start))
                spy.threads.add(threading.current_thread().name)
                spy.active += 1
                spy.peak = max(spy.peak, spy.active)
            try:
                time.sleep(spy.delay)
                return inner(window)
            finally:
                with spy.lock:
                    spy.active -= 1

        adapter.partitions = partitions  # type: ignore[method-assign]
        return adapter


def test_plan_tasks_fusion_order_and_not_ready(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(0, 5))
    write_tree(tmp_path, "imp", range(5, 6), marker=False)
    write_tree(tmp_path, "clk", range(0, 6), files=2)
    spy = Spy()
    planner = Planner(two_streams(), SourceContext(str(tmp_path)), threads=2, adapter_factory=spy)
    plan = planner.plan(TimeWindow.hours_from(T0, 7))  # hour 6 does not exist at all
    # Fusion: imp is listed once per hour for both streams (2 ops x 7 hours, not 3 x 7).
    assert len(spy.calls) == 14 and plan.stats.listings == 14
    assert plan.counts[("history", "imp_h")].tasks == 15 and plan.counts[("fresh", "imp_f")].tasks == 15
    assert plan.counts[("history", "clk_h")].tasks == 12
    assert len(plan.tasks) == plan.stats.tasks == 42 and plan.stats.files == 27
    tasks = list(plan.tasks)
    assert tasks == sorted(tasks, key=lambda t: t.order_key)
    assert [plan.tasks[i] for i in (0, 17, -1)] == [tasks[0], tasks[17], tasks[-1]]
    assert plan.tasks[3:6] == tasks[3:6]
    fused = [t for t in tasks if t.read.uri.endswith("hour=02/part-00001.parquet") and "/imp/" in t.read.uri]
    assert {(t.stream, t.read.source) for t in fused} == {("history", "imp_h"), ("fresh", "imp_f")}
    assert fused[0].read.uri == fused[1].read.uri and fused[0].size_bytes == 13
    assert DataTask.from_json(tasks[0].to_json()) == tasks[0]
    states = {(p.source, p.partition): (p.state, p.reason) for p in plan.not_ready}
    assert "no _SUCCESS marker" in states[("imp_h", T0 + 5 * H)][1]
    assert "does not exist" in states[("imp_f", T0 + 6 * H)][1]
    assert len(plan.not_ready) == 5  # imp: hours 5 and 6 for two streams; clk: hour 6
    assert plan.to_dict()["stats"]["tasks"] == 42


def test_slide_by_one_hour_lists_only_the_new_hour(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(0, 30))
    write_tree(tmp_path, "clk", range(0, 30))
    write_tree(tmp_path, "clk", range(30, 31), marker=False)
    spy, cache = Spy(), ListingCache()
    planner = Planner(two_streams(), SourceContext(str(tmp_path)), threads=3, cache=cache, adapter_factory=spy)
    first = planner.plan(TimeWindow.hours_from(T0, 24))
    assert len(spy.calls) == 48 and first.stats.cache_hits == 0
    spy.calls.clear()
    slid = planner.plan(TimeWindow.hours_from(T0 + H, 24))
    assert sorted(spy.calls) == [("clk", T0 + 24 * H), ("imp", T0 + 24 * H)]
    assert slid.stats.listings == 2 and slid.stats.cache_hits == 46
    assert len(slid.tasks) == len(first.tasks)
    # Not-ready partitions are never cached: they are listed again each time.
    spy.calls.clear()
    planner.plan(TimeWindow(T0 + 29 * H, T0 + 31 * H))
    assert sorted(spy.calls) == [("clk", T0 + 29 * H), ("clk", T0 + 30 * H), ("imp", T0 + 29 * H), ("imp", T0 + 30 * H)]
    spy.calls.clear()
    again = planner.plan(TimeWindow(T0 + 29 * H, T0 + 31 * H))
    assert sorted(spy.calls) == [("clk", T0 + 30 * H), ("imp", T0 + 30 * H)]
    assert {(p.source, p.state) for p in again.not_ready} == {
        ("clk_h", "not_ready"),
        ("imp_h", "not_ready"),
        ("imp_f", "not_ready"),
    }


def test_thread_count_is_respected(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(0, 12), files=1)
    write_tree(tmp_path, "clk", range(0, 12), files=1)
    for threads in (1, 3):
        spy = Spy(delay=0.02)
        Planner(two_streams(), SourceContext(str(tmp_path)), threads=threads, adapter_factory=spy).plan(
            TimeWindow.hours_from(T0, 12)
        )
        assert len(spy.threads) <= threads and all(name.startswith("dtgg") for name in spy.threads)
        assert spy.peak <= threads
        if threads == 3:
            assert spy.peak >= 2  # 24 sleeping listings on 3 workers overlap
    with pytest.raises(ValueError):
        Planner(two_streams(), SourceContext(str(tmp_path)), threads=0)


def test_join_tasks_wait_for_right_side_up_to_end_plus_lateness(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(0, 4))
    write_tree(tmp_path, "clk", range(0, 3), files=2)  # clicks of hour 3 not there yet
    join = {"left": "imp_h", "right": "clk_h", "key": "sample_id", "lateness": "15m"}
    plan = Planner(two_streams(join), SourceContext(str(tmp_path)), threads=2).plan(TimeWindow.hours_from(T0, 4))
    joins = [t for t in plan.tasks if t.stream == "history"]
    assert {t.partition for t in joins} == {T0, T0 + H}  # hour 2 needs clicks of hour 3
    assert all(t.read.source == "imp_h" and t.join is not None for t in joins)
    assert joins[0].join.lateness_s == 900 and joins[0].join.key == "sample_id"
    first = next(t for t in joins if t.partition == T0)
    assert [(r.source, r.partition) for r in first.right_reads] == [("clk_h", T0)] * 2 + [("clk_h", T0 + H)] * 2
    assert DataTask.from_json(first.to_json()) == first
    waiting = [p for p in plan.not_ready if p.state == "waiting"]
    assert [(p.source, p.partition) for p in waiting] == [("imp_h", T0 + 2 * H), ("imp_h", T0 + 3 * H)]
    assert "waiting for clk_h" in waiting[0].reason and "03:15" in waiting[0].reason
    assert ("clk_h", T0 + 3 * H) in {(p.source, p.partition) for p in plan.not_ready}
    assert plan.counts[("history", "clk_h")].tasks == 0  # the right side only feeds the joiner
    assert len([t for t in plan.tasks if t.stream == "fresh"]) == 12


def test_zero_lateness_joins_within_the_partition(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(0, 2))
    write_tree(tmp_path, "clk", range(0, 1))
    join = {"left": "imp_h", "right": "clk_h", "key": "sample_id", "lateness": "0s"}
    plan = Planner(two_streams(join), SourceContext(str(tmp_path)), threads=1).plan(TimeWindow.hours_from(T0, 1))
    joins = [t for t in plan.tasks if t.stream == "history"]
    assert len(joins) == 3 and {r.partition for r in joins[0].right_reads} == {T0}


def test_window_is_clipped_to_dataset_and_errors_are_reported(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(0, 3))
    write_tree(tmp_path, "clk", range(0, 3))
    ds = two_streams(start="2026-11-01T01:00:00Z", end="2026-11-01T02:00:00Z")
    plan = Planner(ds, SourceContext(str(tmp_path))).plan(TimeWindow(T0 - 5 * H, T0 + 5 * H))
    assert {t.partition for t in plan.tasks} == {T0 + H} and not plan.not_ready

    def broken(spec, context):
        adapter = make_adapter(spec, context)
        if spec.path == "clk":
            adapter.partitions = lambda window: (_ for _ in ()).throw(OSError("namenode down"))  # type: ignore
        return adapter

    plan = Planner(two_streams(), SourceContext(str(tmp_path)), adapter_factory=broken).plan(
        TimeWindow.hours_from(T0, 2)
    )
    errors = [p for p in plan.not_ready if p.state == "error"]
    assert len(errors) == 2 and "namenode down" in errors[0].reason
    assert plan.counts[("history", "imp_h")].tasks == 6


def test_empty_ready_partition_needs_allow_empty(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(0, 1), files=0)
    write_tree(tmp_path, "clk", range(0, 1))
    plan = Planner(two_streams(), SourceContext(str(tmp_path))).plan(TimeWindow.hours_from(T0, 1))
    assert {(p.source, p.state) for p in plan.not_ready} == {("imp_h", "error"), ("imp_f", "error")}


def test_task_block_round_trips_and_is_compact() -> None:
    tasks = [
        ReadTask("a", T0, f"/data/imp/dt=2026-11-01/hour=00/part-{i:05d}.parquet", size_bytes=1000 + i)
        for i in reversed(range(2000))
    ]
    block = TaskBlock.from_tasks(T0, None, tasks)
    assert [block.read_task(i, "a") for i in range(len(block))] == sorted(tasks, key=lambda t: t.task_id)
    assert block.read_task(0, "b").source == "b" and block.bytes == sum(t.size_bytes for t in tasks)
    spans = [ReadTask("k", T0, "topic:0", s, s + 10, rows=10, version="7") for s in (20, 0, 10)]
    assert [b.task_id for b in TaskBlock.from_tasks(T0, "7", spans).read_tasks("k")] == sorted(t.task_id for t in spans)
    names = [f"/data/imp/dt=2026-11-01/hour=00/part-{i:05d}.parquet" for i in range(20_000)]
    many = [ReadTask("a", T0, name, size_bytes=i) for i, name in enumerate(names)]
    del names
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    big = TaskBlock.from_tasks(T0, None, many)
    del many  # the block keeps only its own compact columns
    per_file = (tracemalloc.get_traced_memory()[0] - before) / len(big)
    tracemalloc.stop()
    assert per_file < 60, per_file  # a ReadTask object alone is ~280 bytes


def test_listing_cache_is_bounded_by_files() -> None:
    cache = ListingCache(max_files=5)
    blocks = [TaskBlock.from_tasks(T0 + i * H, None, [ReadTask("a", T0, f"f{j}") for j in range(2)]) for i in range(4)]
    for i, block in enumerate(blocks):
        cache.put("k", T0 + i * H, None, block)
    assert cache.files <= 5 and cache.get("k", T0, None) is None and cache.get("k", T0 + 3 * H, None) is blocks[3]
    assert cache.stats()["evictions"] == 2 and cache.get("k", T0 + 3 * H, "v2") is None


def test_mixed_granularity_order_matches_order_key(tmp_path: Path) -> None:
    write_tree(tmp_path, "imp", range(20, 30), files=2)
    for day in range(2):
        directory = tmp_path / "daily" / f"dt=2026-11-0{day + 1}"
        directory.mkdir(parents=True)
        for i in range(3):
            (directory / f"f{i}.parquet").write_bytes(b"y")
        (directory / "_SUCCESS").touch()
    ds = DatasetSpec.model_validate(
        {
            "start": "2026-11-01",
            "streams": [
                {
                    "name": "s",
                    "sources": [
                        {"name": "imp", "type": "parquet", "path": "imp", "columns": COLUMNS},
                        {"name": "day", "type": "parquet", "path": "daily", "granularity": "day", "columns": COLUMNS},
                    ],
                },
                {"name": "a", "sources": [{"name": "imp_a", "type": "parquet", "path": "imp", "columns": COLUMNS}]},
            ],
        }
    )
    plan = Planner(ds, SourceContext(str(tmp_path)), threads=2).plan(TimeWindow(T0 + 20 * H, T0 + 30 * H))
    tasks = list(plan.tasks)
    assert len(tasks) == 2 * 10 * 2 + 2 * 3
    assert tasks == sorted(tasks, key=lambda t: t.order_key)
