"""DTGG compile step (pure): ops, fusion of sources that scan the same data, timer order."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from primus_dagster.data.graph import JoinerOp, SinkOp, TimerOp, aligned_windows, compile_graph, fusion_key
from primus_dagster.data.sources import SourceContext, TimeWindow
from primus_dagster.spec import DatasetSpec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
COLUMNS = {"ts": "event_time", "label": "click", "dense": ["d0"]}


def pq_source(name: str, path: str, **extra) -> dict:
    return {"name": name, "type": "parquet", "path": path, "columns": COLUMNS, **extra}


def dataset(streams: list[dict], **extra) -> DatasetSpec:
    return DatasetSpec.model_validate({"start": "2026-11-01", "streams": streams, **extra})


def test_fusion_shares_one_source_op_across_streams() -> None:
    ds = dataset(
        [
            {"name": "a", "sources": [pq_source("imp_a", "pq/imp"), pq_source("clk_a", "pq/clk")]},
            {
                "name": "b",
                "sources": [
                    pq_source("imp_b", "./pq/imp/", columns={"ts": "t", "dense": "dense_list"}, kind="stream"),
                    pq_source("clk_b", "/root/pq/clk"),  # the same directory, written absolute
                    pq_source("imp_marker", "pq/imp", success_marker=None),  # lists differently: own op
                ],
            },
        ]
    )
    graph = compile_graph(ds, SourceContext("/root"))
    ops = {op.id: op for op in graph.sources}
    assert len(ops) == 3
    imp = graph.op_for("imp_a")
    assert imp is graph.op_for("imp_b") and imp.fused
    assert imp.consumers == (("a", "imp_a"), ("b", "imp_b"))
    assert imp.location == "/root/pq/imp"
    assert graph.op_for("clk_a") is graph.op_for("clk_b")
    marker = graph.op_for("imp_marker")
    assert marker is not imp and not marker.fused and marker.id == imp.id + "#2"
    assert {("timer:a", imp.id, "imp_a"), ("timer:b", imp.id, "imp_b"), (imp.id, "sink", "b/imp_b")} <= set(graph.edges)
    data = json.loads(json.dumps(graph.to_dict()))
    assert [n["op"] for n in data["nodes"]].count("source") == 3
    assert "FUSED" in graph.render() and "feeds: a/imp_a, b/imp_b" in graph.render()


def test_fusion_key_ignores_consumer_settings_but_not_location_or_type() -> None:
    ctx = SourceContext("/data")
    ds = dataset(
        [
            {
                "name": "s",
                "sources": [
                    pq_source("x", "p", batch_rows=10, label_delay="1h"),
                    pq_source("y", "/data/p"),
                    pq_source("z", "p", granularity="day"),
                    {"name": "d", "type": "delta", "uri": "p", "columns": COLUMNS},
                ],
            }
        ]
    )
    keys = {s.name: fusion_key(s, ctx) for _, s in ds.all_sources()}
    assert keys["x"] == keys["y"]
    assert keys["x"] != keys["z"] and keys["x"] != keys["d"]


def test_join_stream_compiles_joiner_between_sources_and_sink() -> None:
    ds = dataset(
        [
            {
                "name": "labelled",
                "sources": [pq_source("imp", "imp"), pq_source("clk", "clk")],
                "join": {"left": "imp", "right": "clk", "key": "sample_id", "lateness": "15m"},
            }
        ]
    )
    graph = compile_graph(ds, SourceContext("/d"))
    joiner = graph.joiner_of("labelled")
    assert isinstance(joiner, JoinerOp) and joiner.lateness == timedelta(minutes=15)
    assert isinstance(graph.nodes["sink"], SinkOp)
    imp, clk = graph.op_for("imp").id, graph.op_for("clk").id
    assert (imp, "join:labelled", "imp (left)") in graph.edges
    assert (clk, "join:labelled", "clk (right)") in graph.edges
    assert ("join:labelled", "sink", "labelled") in graph.edges
    assert not any(a in (imp, clk) and b == "sink" for a, b, _ in graph.edges)


def test_timer_emits_hour_and_day_partitions_chronologically() -> None:
    timer = TimerOp("timer:s", "s", timedelta(days=1), timedelta(hours=1), (("h", "hour"), ("d", "day")))
    window = TimeWindow(T0 + timedelta(hours=22), T0 + timedelta(days=2, hours=4))  # 30 hours
    emitted = timer.emit(window)
    starts = [start for _, start in emitted]
    assert starts == sorted(starts)
    hours = [s for name, s in emitted if name == "h"]
    days = [s for name, s in emitted if name == "d"]
    assert hours == [window.start + timedelta(hours=i) for i in range(30)]
    assert days == [T0, T0 + timedelta(days=1), T0 + timedelta(days=2)]  # each day once, overlapping
    assert emitted.index(("d", T0 + timedelta(days=1))) == emitted.index(("h", T0 + timedelta(days=1))) + 1


def test_timer_ticks_follow_the_slide() -> None:
    ds = dataset(
        [
            {
                "name": "s",
                "window": "2d",
                "slide": "1d",
                "sources": [pq_source("h", "h"), pq_source("d", "d", granularity="day")],
            },
            {"name": "t", "sources": [pq_source("only_hours", "x")]},
        ]
    )
    graph = compile_graph(ds, SourceContext("/d"))
    by_stream = {t.stream: t for t in graph.timers}
    assert by_stream["s"].slide == timedelta(days=1) and by_stream["t"].slide == timedelta(hours=1)
    ticks = by_stream["s"].ticks(TimeWindow(T0 + timedelta(hours=12), T0 + timedelta(days=2)))
    assert [(t.start, t.end) for t in ticks] == [
        (T0 + timedelta(hours=12), T0 + timedelta(days=1)),
        (T0 + timedelta(days=1), T0 + timedelta(days=2)),
    ]
    assert len(aligned_windows(TimeWindow(T0, T0 + timedelta(hours=5)), timedelta(hours=2))) == 3
