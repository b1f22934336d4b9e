"""DTGG: data task graph generation (Timer -> DataSource -> Joiner -> Sink).

``compile_graph`` turns a DatasetSpec into a :class:`TaskGraph` (pure; fuses sources that
scan the same physical data); :class:`Planner` runs it over a time window with a thread pool
and a :class:`ListingCache`, returning a :class:`Plan` of ordered :class:`DataTask` s (small files
packed by a :class:`PackRule`);
``join_labels`` is the Joiner's row-level rule, used by executors on join tasks.
"""

from primus_dagster.data.graph.join import join_labels
from primus_dagster.data.graph.listing_cache import ListingCache, PackRule, TaskBlock
from primus_dagster.data.graph.ops import (
    JoinerOp,
    SinkOp,
    SourceOp,
    TaskGraph,
    TimerOp,
    aligned_windows,
    compile_graph,
    fusion_key,
)
from primus_dagster.data.graph.plan import ConsumerCount, NotReady, Plan, PlanStats, Segment, TaskSequence
from primus_dagster.data.graph.planner import Planner, clip_window
from primus_dagster.data.graph.report import plan_report, render_plan

__all__ = [
    "ConsumerCount",
    "JoinerOp",
    "ListingCache",
    "NotReady",
    "PackRule",
    "Plan",
    "PlanStats",
    "Planner",
    "Segment",
    "SinkOp",
    "SourceOp",
    "TaskBlock",
    "TaskGraph",
    "TaskSequence",
    "TimerOp",
    "aligned_windows",
    "clip_window",
    "compile_graph",
    "fusion_key",
    "join_labels",
    "plan_report",
    "render_plan",
]
