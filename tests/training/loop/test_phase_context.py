"""What a trainer of a phase starts from: its counters of the start checkpoint (a smaller group's rank 0
keeps the counts of the ranks it no longer has), and its deterministic mixture replaying past them."""

from __future__ import annotations

import dataclasses

from primus_dagster.data import QueueStat
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.loop import PhaseContext, RankCounters, TrainerStart


def _context(world: int, start: TrainerStart | None, *, phase: str = "mixed") -> PhaseContext:
    spec = TrainingSpec(mode="mixed", seed=3, model={"type": "single"})
    context = PhaseContext.outside_run(spec, world, kind_weights={"batch": 1.0, "stream": 1.0})
    return dataclasses.replace(context, phase=phase, deterministic=True, start=start)


RANKS = tuple(RankCounters(10 * r, 100 * r, {"batch": 100 * r, "stream": 0}, r, 5 + r).to_dict() for r in range(3))


def test_each_rank_starts_from_its_counters_and_a_smaller_groups_rank_0_keeps_the_rest() -> None:
    start = TrainerStart("ck", "resume", step=30, phase="mixed", ranks=RANKS)
    assert _context(3, start).start_counters(2) == RankCounters.from_dict(RANKS[2])
    two = _context(2, start)
    assert two.start_counters(0).samples == 0 + 200 and two.start_counters(0).batches == 5 + 7
    assert two.start_counters(1) == RankCounters.from_dict(RANKS[1])
    assert _context(2, None).start_counters(0) == RankCounters()
    assert _context(2, dataclasses.replace(start, kind="warm")).start_counters(1) == RankCounters()


def test_reader_batches_count_only_inside_the_checkpoints_phase() -> None:
    done = TrainerStart("ck", "resume", step=30, phase="mixed", phase_done=True, ranks=RANKS)
    assert _context(3, done).start_counters(1).batches == 0 and _context(3, done).start_counters(1).samples == 100
    other = TrainerStart("ck", "resume", step=30, phase="batch", ranks=RANKS)
    assert _context(3, other, phase="stream").start_counters(1).batches == 0


def test_a_deterministic_mixture_replays_the_draws_of_the_batches_trained_before_the_start() -> None:
    start = TrainerStart("ck", "resume", step=30, phase="mixed", ranks=RANKS)
    fresh, resumed = _context(3, None).mixture(1), _context(3, start).mixture(1)
    assert fresh is not None and resumed is not None
    stats = {name: QueueStat(name, 1, 1, 0, 0.0, 0) for name in ("batch", "stream")}
    picks = [fresh(stats) for _ in range(6 + 8)]
    assert [resumed(stats) for _ in range(8)] == picks[6:]  # rank 1 trained 6 batches before the checkpoint
