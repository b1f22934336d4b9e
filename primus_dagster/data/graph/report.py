"""Human and JSON views of a plan (what ``primus-dagster plan`` prints)."""

from __future__ import annotations

from typing import Any

from primus_dagster.data.graph.plan import Plan


def plan_report(plan: Plan) -> dict[str, Any]:
    """The plan without its task list: window, graph, counts per consumer, not-ready partitions, stats."""
    return plan.to_dict(with_tasks=False)


def render_plan(plan: Plan, max_not_ready: int = 20) -> str:
    """The graph, the task counts per stream/source and the partitions left out."""
    s = plan.stats
    lines = [
        f"window {plan.window}",
        plan.graph.render(),
        "",
        f"tasks: {s.tasks:,} from {s.files:,} listed read units ({s.bytes:,} bytes); "
        f"{s.listings} listing call(s), {s.cache_hits} cache hit(s), {s.threads} thread(s), {s.seconds:.3f}s",
    ]
    lines.append(f"  {'stream':<16} {'source':<28} {'tasks':>10} {'bytes':>16} {'ready':>6} {'not ready':>9}")
    for (stream, source), c in plan.counts.items():
        lines.append(
            f"  {stream:<16} {source:<28} {c.tasks:>10,} {c.bytes:>16,} "
            f"{c.ready_partitions:>6} {c.not_ready_partitions:>9}"
        )
    if plan.not_ready:
        lines.append(f"not ready: {len(plan.not_ready)} partition(s)")
        for p in plan.not_ready[:max_not_ready]:
            lines.append(
                f"  {p.partition:%Y-%m-%dT%H:%M}Z {p.stream}/{p.source} [{p.state}] {' '.join(p.reason.split())}"
            )
        if len(plan.not_ready) > max_not_ready:
            lines.append(f"  ... and {len(plan.not_ready) - max_not_ready} more (use --json for all)")
    else:
        lines.append("not ready: none")
    return "\n".join(lines)
