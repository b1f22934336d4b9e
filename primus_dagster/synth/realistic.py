"""The synthetic world in the shape of a real team's table (``primus-dagster synth --schema realistic``).

Not a second world: :class:`RealisticWorld` *is* a :class:`~primus_dagster.synth.world.SyntheticWorld`
(same seed, latent state, trends, daily cycle, label delay and ``sample_id``), and each hour is the
native hour (:meth:`RealisticWorld.native_hour`) converted row for row into the columns a team would
hold:

* ids as strings (``user_id`` ``"u000123"``, ``item_id`` ``"i004711"``);
* demographics as strings, fixed per user and derived from the user's latent state (so they carry
  signal without changing a label): ``gender`` from the taste vector's first component, ``age_group``
  from the user's propensity, ``country`` from the second component;
* ``device`` as a string (``android``, ``ios``, ``web``, ``tablet``: the world's device effect);
* ``genres``: ``list<string>`` of 1-4 genres per item, fixed per item and derived from its topic (a
  topic's primary genre always, its secondary one mostly, and up to two random others), so they
  carry the topic's affinity and trend;
* ``event_ts``: int64 epoch **seconds**;
* raw-scale, skewed numbers, each a monotone function of one of the world's informative dense
  features (the same signal on a raw scale): ``user_clicks_30d`` (heavy-tailed count, from ``d0``,
  the user's propensity), ``item_age_days`` (0..3000, from ``d1``: popular items are newer),
  ``topic_ctr_1h`` (a rate in (0, 1), from ``d2``: last hour's topic trend), ``price`` (lognormal in
  1..5000, from ``d3``: a direct effect) and ``session_len_s`` (from ``d4``: a direct effect);
* label ``liked`` (int32 0/1: the world's click) and ``sample_id`` (int64, unchanged).

``click_delay_s`` stays in the table as ground truth (the stream copy needs it; the writers drop it).
Batch sources get the complete labels, stream sources the stream copy (clicks within
``stream_label_window``), as in the CTR world. The columns are described in
``docs/synthetic_world.md``; a spec over them is ``examples/realistic/job.yaml``.

Example::

    from datetime import datetime, timezone
    world = RealisticWorld(WorldConfig(seed=7, rows_per_hour=5_000), datetime(2026, 11, 1, tzinfo=timezone.utc))
    table = world.hour(0)               # user_id "u…", genres list<string>, event_ts epoch seconds, …
    stream = world.stream_copy(table)   # liked = 1 only for clicks within the stream label window
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa

from primus_dagster.synth.world import SyntheticWorld, WorldConfig, stream_copy

LABEL = "liked"
TS_COLUMN = "event_ts"
#: Names of the world's devices (index = the native ``device`` id).
DEVICES = ("android", "ios", "web", "tablet")
GENDERS = ("female", "male", "unknown")
AGE_GROUPS = ("18-24", "25-34", "35-44", "45-54", "55+")
_AGE_SHARE = np.array([0.14, 0.31, 0.24, 0.17, 0.14])
COUNTRIES = ("US", "IN", "BR", "GB", "DE", "FR", "JP", "ID", "MX", "CA", "ES", "IT")
GENRES = (
    "action",
    "adventure",
    "animation",
    "children",
    "comedy",
    "crime",
    "documentary",
    "drama",
    "fantasy",
    "film-noir",
    "horror",
    "musical",
    "mystery",
    "romance",
    "sci-fi",
    "thriller",
    "war",
    "western",
)
_UNKNOWN_GENDER = 0.04  # share of users who did not say


def realistic_schema() -> pa.Schema:
    """Schema of :meth:`RealisticWorld.hour` (``click_delay_s`` is ground truth and never written).

    Example::

        realistic_schema().field("genres").type      # list<item: string>
    """
    return pa.schema(
        [
            pa.field("sample_id", pa.int64(), nullable=False),
            pa.field(TS_COLUMN, pa.int64(), nullable=False),
            pa.field(LABEL, pa.int32(), nullable=False),
            pa.field("click_delay_s", pa.float32()),
            pa.field("user_id", pa.string(), nullable=False),
            pa.field("item_id", pa.string(), nullable=False),
            pa.field("gender", pa.string(), nullable=False),
            pa.field("age_group", pa.string(), nullable=False),
            pa.field("country", pa.string(), nullable=False),
            pa.field("device", pa.string(), nullable=False),
            pa.field("genres", pa.list_(pa.string()), nullable=False),
            pa.field("price", pa.float64(), nullable=False),
            pa.field("item_age_days", pa.int64(), nullable=False),
            pa.field("user_clicks_30d", pa.int64(), nullable=False),
            pa.field("session_len_s", pa.int64(), nullable=False),
            pa.field("topic_ctr_1h", pa.float32(), nullable=False),
        ]
    )


def _id_strings(prefix: str, n: int) -> pa.Array:
    """``prefix`` + the zero-padded index (at least 6 digits) of each of ``n`` ids."""
    width = max(6, len(str(max(n - 1, 0))))
    digits = np.char.zfill(np.arange(n).astype(str), width)
    return pa.array(np.char.add(prefix, digits), pa.string())


def _by_quantile(score: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Category index of each value: the lowest ``shares[0]`` of the scores get 0, the next ``shares[1]`` 1, …"""
    cuts = np.quantile(score, np.cumsum(shares)[:-1] / shares.sum())
    return np.searchsorted(cuts, score, side="right").astype(np.int64)


def _genre_lists(topics: np.ndarray, n_topics: int, rng: np.random.Generator) -> pa.ListArray:
    """1-4 distinct genres per item: its topic's primary genre, mostly its secondary one, 0-2 random others."""
    g, n = len(GENRES), len(topics)
    primary = rng.permutation(np.resize(np.arange(g), n_topics))  # every genre leads a topic before any repeats
    secondary = (primary + rng.integers(1, g, size=n_topics)) % g  # never the primary
    member = np.zeros((n, g), dtype=bool)
    rows = np.arange(n)
    member[rows, primary[topics]] = True
    member[rows, secondary[topics]] = rng.random(n) < 0.7
    extra = rng.choice(3, size=n, p=[0.6, 0.3, 0.1])
    keys = np.where(member, np.inf, rng.random((n, g)))  # random order of the genres not yet taken
    picks = np.argsort(keys, axis=1)[:, :2]
    for k in range(2):
        chosen = extra > k
        member[rows[chosen], picks[chosen, k]] = True
    item_rows, genre = np.nonzero(member)  # row-major: grouped by item, genres in GENRES order
    offsets = np.concatenate([[0], np.cumsum(np.bincount(item_rows, minlength=n))]).astype(np.int32)
    names = pa.array(GENRES, pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), names.take(pa.array(genre)))


class RealisticWorld(SyntheticWorld):
    """The :class:`SyntheticWorld` whose hours come in a real team's shape (module docstring).

    Needs ``n_dense >= 5`` (the raw numeric columns are made of ``d0 … d4``). Deterministic like
    the CTR world: hour ``h`` depends on the seed and the absolute hour only.

    Example::

        world = RealisticWorld(WorldConfig(seed=3), datetime(2026, 11, 1, tzinfo=timezone.utc))
        t = world.hour(5)                                    # the realistic columns
        assert t["sample_id"].equals(world.native_hour(5)["sample_id"])
        write_world(job, SourceContext("/data"), world, range(24))   # the writers take it as it is
    """

    def __init__(self, config: WorldConfig, start: datetime):
        if config.n_dense < 5:
            raise ValueError(
                f"the realistic schema needs n_dense >= 5 (its numbers come from d0..d4), got {config.n_dense}"
            )
        super().__init__(config, start)
        rng = np.random.default_rng([config.seed, 10])
        users, items = config.users, config.items
        self.user_names = _id_strings("u", users)
        self.item_names = _id_strings("i", items)
        taste = self.user_vectors * config.latent_dim**0.25  # unit-variance components
        gender = (taste[:, 0] + 0.5 * rng.standard_normal(users) > 0).astype(np.int64)
        self.user_gender = np.where(rng.random(users) < _UNKNOWN_GENDER, 2, gender)
        self.user_age_group = _by_quantile(self.user_bias / 0.3 + 0.8 * rng.standard_normal(users), _AGE_SHARE)
        country_share = 1.0 / (np.arange(len(COUNTRIES)) + 1.5)
        self.user_country = _by_quantile(
            taste[:, 1 % config.latent_dim] + 0.7 * rng.standard_normal(users), country_share
        )
        self.item_genres = _genre_lists(self.item_topic, config.topics, rng)

    def native_hour(self, h: int) -> pa.Table:
        """Hour ``h`` in the CTR world's native columns (:meth:`SyntheticWorld.hour`)."""
        return super().hour(h)

    def hour(self, h: int) -> pa.Table:
        """Impressions of hour ``h`` in the realistic columns (:func:`realistic_schema`); deterministic."""
        return self.convert(self.native_hour(h))

    def convert(self, native: pa.Table) -> pa.Table:
        """One native hour (:meth:`native_hour`) as the realistic columns, row for row (vectorised)."""
        users = native.column("user_id").to_numpy()
        items = pa.array(native.column("item_id").to_numpy())
        d = [native.column(f"d{j}").to_numpy().astype(np.float64) for j in range(5)]
        event_ts = native.column("event_time").cast(pa.int64()).to_numpy() // 1_000_000
        names = {k: pa.array(v, pa.string()) for k, v in (("g", GENDERS), ("a", AGE_GROUPS), ("c", COUNTRIES))}
        arrays: list[pa.Array | pa.ChunkedArray] = [
            native.column("sample_id"),
            pa.array(event_ts, pa.int64()),
            native.column("click"),
            native.column("click_delay_s"),
            self.user_names.take(pa.array(users)),
            self.item_names.take(items),
            names["g"].take(pa.array(self.user_gender[users])),
            names["a"].take(pa.array(self.user_age_group[users])),
            names["c"].take(pa.array(self.user_country[users])),
            pa.array(DEVICES, pa.string()).take(pa.array(native.column("device").to_numpy())),
            self.item_genres.take(items),
            pa.array(np.round(np.clip(np.exp(3.0 + 1.4 * d[3]), 1.0, 5000.0), 2)),
            pa.array(np.clip(np.floor(np.exp(6.5 - 0.9 * d[1])), 0, 3000).astype(np.int64)),
            pa.array(np.floor(np.expm1(np.maximum(2.0 + 1.3 * d[0], 0.0))).astype(np.int64)),
            pa.array(np.clip(np.round(np.exp(4.5 + d[4])), 1, 36_000).astype(np.int64)),
            pa.array((1.0 / (1.0 + np.exp(3.0 - 0.8 * d[2]))).astype(np.float32)),
        ]
        return pa.Table.from_arrays(arrays, schema=realistic_schema())

    def stream_copy(self, table: pa.Table) -> pa.Table:
        """``liked`` = 1 only where the click arrived within the world's ``stream_label_window``."""
        return stream_copy(table, self.config.stream_label_window, label=LABEL)

    def click_logit(self, table: pa.Table, h: int, *, with_trend: bool = True) -> np.ndarray:
        """The generator's click logit of each row of ``hour(h)`` (``table``), from the native hour."""
        native = self.native_hour(h)
        if native.num_rows != table.num_rows:
            raise ValueError(f"table has {table.num_rows} rows; hour {h} has {native.num_rows}")
        return super().click_logit(native, h, with_trend=with_trend)

    def __repr__(self) -> str:
        return f"RealisticWorld(seed={self.config.seed}, start={self.start.isoformat()})"
