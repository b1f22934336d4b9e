"""The seeded synthetic CTR world and its writers (``primus-dagster synth``).

Example::

    from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
    world = SyntheticWorld(WorldConfig(seed=7), job.dataset.start)
    write_world(job, SourceContext(data_root="/data"), world, range(24))
"""

from primus_dagster.synth.world import SyntheticWorld, WorldConfig, shard_of, stream_copy, world_schema
from primus_dagster.synth.writers import SourceStats, WriteSummary, write_world

__all__ = [
    "SourceStats",
    "SyntheticWorld",
    "WorldConfig",
    "WriteSummary",
    "shard_of",
    "stream_copy",
    "world_schema",
    "write_world",
]
