"""Next-day AUC of the spec defaults on data in a real team's shape, beside a popularity prior and
logistic regression: the realistic synthetic world and MovieLens-100k.

**Training: ``primus-dagster train`` with the spec defaults.** Every model is trained by the CLI in a
subprocess (``primus-dagster train SPEC --start .. --hours .. --data-root .. --json``: its own
executors, Flight reader, MLflow on a SQLite store in the run's temp dir) from a copy of the example
spec loaded with ``yaml`` in which only these keys change: ``training.mode`` and
``training.model.type`` (the variant), ``training.seed`` (the seed) and ``training.eval_hours`` (the
next-day evaluation span) -- features, transforms, tables, learning rate, batch size, model sizes
are the spec's (and its ``ModelSpec`` defaults). The model's AUC is the train command's own held-out
evaluation (``eval_auc``: the complete-label batch rows of the hours after the window, every row).

**The realistic world** (``primus-dagster synth --schema realistic --spec examples/realistic/job.yaml
--seed s``: string ids and demographics, ``genres`` list, epoch-second times, raw-scale skewed
numbers; docs/synthetic_world.md), per seed ``s`` (world seed = ``training.seed`` = ``s``) in its own
data root with its own embedded Kafka broker (``EmbeddedBroker``, stopped after the seed):

* written: the two batch shards (``events_parquet`` daily Hive Parquet, ``events_delta`` hourly
  Delta; disjoint, together every row) of day 0 (2026-11-01) and day 2 (2026-11-03), the Kafka
  stream copy of day 1 (+ the first hour of day 2, so the window's last stream hour is complete);
* trained: the window day 1 (``--start 2026-11-02 --hours 24``) with the spec's ``batch_lag: 24h``:
  the stream of day 1 and the complete batch rows of day 0, ``training.mode: mixed``; variants
  ``single`` (``model.type: single``) and ``mtrm_mixed`` (``model.type: mtrm``);
* evaluated: day 2's batch rows (``eval_hours: 24``; both shards, complete labels).

**MovieLens-100k** (``examples/movielens/convert.py --out <root>/movielens``, with
``examples/movielens/job.yaml``: ``mode: batch``, ``single`` tower): trained on every rating before
1998-04-01 (1997-09-20 .. 1998-03-31, ~85 k ratings: the whole history before the evaluation span,
``--ml-train-start`` / ``--ml-train-end``), evaluated on the next 7 days (1998-04-01 .. 1998-04-07,
5 354 ratings; ``--ml-eval-days``, ``eval_hours`` = 24 x that). The data is fixed: only
``training.seed`` varies with the seed.

**Baselines** on the same training rows and the same held-out rows, read with pyarrow from the batch
sources' own files (both shards: ``dt=DAY/*.parquet`` of the Hive table, the Delta table through
``deltalake`` filtered on its date column); the training rows are the complete-label batch rows the
window trains on (realistic: day 0, the ``batch_lag``-shifted batch; the model also sees day 1's
stream copy, whose labels are incomplete) -- the rows the train command's own popularity prior counts:

* ``popularity`` -- each item's like-rate on the training rows, smoothed ``(pos + 10 * g) / (n + 10)``
  (``g`` the global rate; an unseen item scores ``g``). The train JSON's ``popularity_aucs["item_id"]``
  (the same prior computed inside the pipeline on hashed ids) is kept beside it as a check;
* ``logreg`` -- scikit-learn ``LogisticRegression(max_iter=1000)`` (lbfgs, ``C=1``) on a
  ``FeatureHasher(2**20, alternate_sign=False)`` one-hot of ``column=value`` for every categorical
  column and ``genres=g`` for every genre of the row, next to the ``StandardScaler``'d
  ``sign(x) * log1p(|x|)`` of every dense column (a missing value: the training mean).

On MovieLens two figures say how much room the data leaves above ``logreg`` (the goal asks the single
tower for logreg + 0.01): ``eval_cold_user_share``, the share of the evaluation rows whose user has no
training row (in a temporal split most of the next week's ratings come from users who joined that
week), and ``logreg_crosses_probe_auc``, the same logistic regression with ``gender`` and ``occupation``
crossed with the item and with each genre, at the best ``C`` of 0.1 / 0.3 / 1 *picked on the
evaluation rows* -- an optimistic bound on what those interactions can add, not a model.

**Statistics.** Per seed the paired differences ``single - logreg``, ``logreg - popularity``,
``mtrm_mixed - single``; mean and 95 % t-interval over seeds (``mean +- t(0.975, n-1) sd / sqrt(n)``);
``auc`` gives each variant's mean AUC with the same interval. Criteria: the interval's lower bound at
or above the threshold (``single_minus_logreg`` >= 0.01, ``logreg_minus_popularity`` > 0,
``mtrm_minus_single`` >= 0); with one seed (``--quick``) the mean is compared instead.

**Compute.** Per realistic seed: three synth runs, two train runs over ~2 x 24 x ``rows_per_hour``
samples and the baselines; per MovieLens seed one train run (~90 k samples). ``--quick`` (seed 0,
2 000 rows/h, one MovieLens seed): 152 s on the 2 shared cores (load ~2; each train run ~35-40 s, most
of it fixed start-up). The full run (seeds 0-4, 20 000 rows/h, the world's default) is estimated at
30-45 min there (~6-7 min per realistic seed, ~40 s per MovieLens seed), not measured yet.
The logistic regression fits only the hashed columns some training row has (the same optimum: an
all-zero column's weight stays 0), 10-40x faster than over all 2**20.

Last line: {"bench": "real_schema", "seeds": [...], "auc": {"single": [mean, lo95, hi95],
"mtrm_mixed": [..], "popularity": [..], "logreg": [..]}, "diffs": {"single_minus_logreg": [..],
"logreg_minus_popularity": [..], "mtrm_minus_single": [..]}, "criteria": {..}, "real_data":
{"dataset": "ml-100k", "auc": {..}, "diffs": {..}, "criteria": {..}, ..}, "settings": {..}, "wall_s": ..}
(lo95/hi95 are null with one seed)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from scipy import sparse
from scipy.stats import t as student_t

from primus_dagster.devtools.kafka_broker import EmbeddedBroker
from primus_dagster.training.metrics import auc

from _common import emit

REPO = Path(__file__).resolve().parents[1]
REALISTIC_SPEC = REPO / "examples" / "realistic" / "job.yaml"
ML_SPEC = REPO / "examples" / "movielens" / "job.yaml"
ML_CONVERT = REPO / "examples" / "movielens" / "convert.py"

REALISTIC_VARIANTS = {"single": ("mixed", "single"), "mtrm_mixed": ("mixed", "mtrm")}  # name -> (mode, model)
POPULARITY_COLUMN = "item_id"
SMOOTHING = 10.0
HASH_FEATURES = 2**20
LOGREG_MAX_ITER = 1000
MARGIN = 0.01  # single >= logreg + MARGIN
USER_COLUMN = "user_id"
# The ceiling probe on MovieLens: logistic regression with these profile columns crossed with the item and
# each genre, at the best C of PROBE_C on the evaluation rows themselves (an optimistic bound, not a model).
ML_PROBE_CROSSES = ("gender", "occupation")
PROBE_C = (0.1, 0.3, 1.0)

REALISTIC_START = date(2026, 11, 1)  # examples/realistic/job.yaml's dataset.start
QUICK_ROWS_PER_HOUR = 2000.0


def log(message: str) -> None:
    print(f"[real_schema {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cli() -> list[str]:
    script = Path(sys.executable).parent / "primus-dagster"  # the installed console script
    return [str(script)] if script.exists() else [sys.executable, "-m", "primus_dagster.cli"]


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"
        )
    return proc


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- specs


OVERRIDES: dict[str, Any] = {}  # --set KEY=VALUE (tuning runs only: the reported figures use the spec's defaults)
MTRM_OVERRIDES: dict[str, Any] = {}  # --set-mtrm KEY=VALUE: the same, MTRM variants only (its own keys)


def variant_spec(base: Path, out: Path, *, mode: str, model_type: str, seed: int, eval_hours: int) -> Path:
    """A copy of ``base`` with only ``training.mode``, ``training.model.type``, ``training.seed`` and
    ``training.eval_hours`` changed (and the ``--set`` overrides of a tuning run)."""
    spec = yaml.safe_load(base.read_text())
    training = spec.setdefault("training", {})
    training["mode"] = mode
    training.setdefault("model", {})["type"] = model_type
    training["seed"] = seed
    training["eval_hours"] = eval_hours
    for key, value in (OVERRIDES | (MTRM_OVERRIDES if model_type == "mtrm" else {})).items():
        node = spec
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def batch_sources(spec_path: Path) -> list[dict]:
    spec = yaml.safe_load(spec_path.read_text())
    return [s for stream in spec["dataset"]["streams"] for s in stream["sources"] if s.get("kind") == "batch"]


# ---------------------------------------------------------------------------------------------- training


def train(
    spec: Path, start: datetime, hours: int, root: Path, run_key: str, args: argparse.Namespace, bootstrap: str | None
) -> dict:
    """``primus-dagster train --json``; its result metadata (+ ``bench_wall_s``, ``quality_line``)."""
    command = [*cli(), "train", str(spec), "--start", start.isoformat(), "--hours", str(hours)]
    command += ["--data-root", str(root), "--json", "--run-key", run_key]
    command += ["--tracking-uri", f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"]
    if args.executors:
        command += ["--executors", str(args.executors)]
    if bootstrap:
        command += ["--kafka-bootstrap", bootstrap]
    (root / "mlflow").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = run(command, args.timeout)
    meta = last_json(proc.stdout)
    meta["bench_wall_s"] = round(time.perf_counter() - started, 1)
    meta["quality_line"] = next((x for x in proc.stderr.splitlines()[::-1] if x.startswith("quality:")), "")
    if "eval_auc" not in meta:
        raise SystemExit(f"{run_key}: the train command did not evaluate (no eval_auc):\n{proc.stderr[-3000:]}")
    return meta


def model_record(meta: dict) -> dict:
    return {
        "auc": meta["eval_auc"],
        "eval_rows": meta.get("eval_rows"),
        "eval_labels": meta.get("eval_labels"),
        "eval_window": meta.get("eval_window"),
        "samples": meta.get("samples"),
        "steps": meta.get("steps"),
        "train_wall_s": meta["bench_wall_s"],
        "pipeline_popularity_auc": meta.get("popularity_auc"),
        "pipeline_popularity_feature": meta.get("popularity_feature"),
        "pipeline_popularity_item_auc": (meta.get("popularity_aucs") or {}).get(POPULARITY_COLUMN),
        "verdict": meta.get("baseline_verdict"),
    }


# ---------------------------------------------------------------------------------------------- baselines


def read_rows(root: Path, sources: list[dict], days: list[str]) -> pa.Table:
    """The rows of ``days`` (``YYYY-MM-DD``) of every batch source (Hive Parquet or Delta), the mapped
    columns only, concatenated."""
    columns = sources[0]["columns"]
    wanted = [columns["label"], *columns.get("sparse", []), *columns.get("lists", []), *columns.get("dense", [])]
    tables: list[pa.Table] = []
    for source in sources:
        if source["type"] == "parquet":
            base = root / source["path"]
            files = [f for day in days for f in sorted((base / f"dt={day}").glob("*.parquet"))]
            tables += [pq.read_table(f, columns=wanted) for f in files]
        elif source["type"] == "delta":
            from deltalake import DeltaTable

            table = DeltaTable(str(root / source["uri"]))
            date_column = source.get("date_column", "dt")
            tables.append(table.to_pyarrow_table(columns=wanted, filters=[(date_column, "in", days)]))
        else:
            raise SystemExit(f"batch source {source['name']!r}: type {source['type']!r} is not read by this bench")
    tables = [t for t in tables if t.num_rows]
    if not tables:
        raise SystemExit(f"no rows in {days[0]}..{days[-1]} under {root}")
    first = tables[0].schema
    return pa.Table.from_arrays(
        [pa.chunked_array([c for t in tables for c in t[name].cast(first.field(name).type).chunks]) for name in wanted],
        names=wanted,
    )


def labels_of(table: pa.Table, label: str) -> np.ndarray:
    return np.asarray(table[label].to_numpy(zero_copy_only=False), dtype=np.float64)


def popularity_auc(train_rows: pa.Table, eval_rows: pa.Table, label: str) -> float:
    """AUC on ``eval_rows`` of each item's smoothed like-rate on ``train_rows``."""
    y = labels_of(train_rows, label)
    items = np.asarray(train_rows[POPULARITY_COLUMN].to_pylist(), dtype=object)
    global_rate = float(y.mean())
    ids, inverse = np.unique(items, return_inverse=True)
    pos = np.bincount(inverse, weights=y, minlength=len(ids))
    count = np.bincount(inverse, minlength=len(ids))
    rate = dict(zip(ids.tolist(), ((pos + SMOOTHING * global_rate) / (count + SMOOTHING)).tolist(), strict=True))
    scores = np.array([rate.get(v, global_rate) for v in eval_rows[POPULARITY_COLUMN].to_pylist()])
    return auc(labels_of(eval_rows, label), scores)


def slog1p(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


class LogRegFeatures:
    """Hashed one-hot of the categorical and genre values + standardised ``sign * log1p`` dense columns."""

    def __init__(self, columns: dict, crosses: tuple[str, ...] = ()) -> None:
        from sklearn.feature_extraction import FeatureHasher

        self.crosses = crosses  # profile columns crossed with the item and each list value (the probe)
        self.sparse = list(columns.get("sparse", []))
        self.lists = list(columns.get("lists", []))
        self.dense = list(columns.get("dense", []))
        self.hasher = FeatureHasher(n_features=HASH_FEATURES, input_type="string", alternate_sign=False)
        self.mean: np.ndarray | None = None
        self.scaler: Any = None

    def _tokens(self, rows: pa.Table):
        cats = [(name, rows[name].to_pylist()) for name in self.sparse]
        lists = [(name, rows[name].to_pylist()) for name in self.lists]
        items = rows[POPULARITY_COLUMN].to_pylist() if self.crosses else []
        for i in range(rows.num_rows):
            tokens = [f"{name}={values[i]}" for name, values in cats]
            for name, values in lists:
                tokens += [f"{name}={g}" for g in values[i] or ()]
            for name, values in cats:
                if name in self.crosses:
                    tokens.append(f"{name}x{POPULARITY_COLUMN}={values[i]}|{items[i]}")
                    tokens += [f"{name}x{lname}={values[i]}|{g}" for lname, lvalues in lists for g in lvalues[i] or ()]
            yield tokens

    def _dense(self, rows: pa.Table) -> np.ndarray:
        if not self.dense:
            return np.zeros((rows.num_rows, 0))
        cols = [np.asarray(rows[name].to_numpy(zero_copy_only=False), dtype=np.float64) for name in self.dense]
        return slog1p(np.stack(cols, axis=1))

    def fit_transform(self, rows: pa.Table) -> sparse.csr_matrix:
        from sklearn.preprocessing import StandardScaler

        dense = self._dense(rows)
        self.mean = np.nanmean(dense, axis=0) if dense.shape[1] else np.zeros(0)
        self.scaler = StandardScaler().fit(self._fill(dense))
        return self._stack(rows, dense)

    def transform(self, rows: pa.Table) -> sparse.csr_matrix:
        return self._stack(rows, self._dense(rows))

    def _fill(self, dense: np.ndarray) -> np.ndarray:
        missing = np.isnan(dense)
        if missing.any():
            dense = np.where(missing, self.mean[None, :], dense)
        return dense

    def _stack(self, rows: pa.Table, dense: np.ndarray) -> sparse.csr_matrix:
        hashed = self.hasher.transform(self._tokens(rows))
        if not dense.shape[1]:
            return hashed.tocsr()
        scaled = self.scaler.transform(self._fill(dense))
        return sparse.hstack([hashed, sparse.csr_matrix(scaled)], format="csr")


def logreg_auc(
    train_rows: pa.Table, eval_rows: pa.Table, columns: dict, crosses: tuple[str, ...] = (), c: float = 1.0
) -> tuple[float, dict]:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    label = columns["label"]
    features = LogRegFeatures(columns, crosses)
    x_train = features.fit_transform(train_rows)
    x_eval = features.transform(eval_rows)
    # Only the columns some training row has: an all-zero column's weight stays 0 under lbfgs from 0 (its
    # gradient is w / C), so the fit is the same, without 2**20-long vectors in every iteration.
    used = np.unique(x_train.indices)
    x_train, x_eval = x_train[:, used], x_eval[:, used]
    model = LogisticRegression(max_iter=LOGREG_MAX_ITER, C=c)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(x_train, labels_of(train_rows, label))
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    score = auc(labels_of(eval_rows, label), model.decision_function(x_eval))
    return score, {"n_iter": int(np.max(model.n_iter_)), "converged": converged, "columns_used": len(used)}


def cold_user_share(train_rows: pa.Table, eval_rows: pa.Table) -> float:
    """The share of ``eval_rows`` whose user has no training row (nothing user-specific to learn from)."""
    seen = set(train_rows[USER_COLUMN].to_pylist())
    users = eval_rows[USER_COLUMN].to_pylist()
    return sum(u not in seen for u in users) / max(len(users), 1)


def crosses_probe(train_rows: pa.Table, eval_rows: pa.Table, columns: dict) -> dict:
    """How far any model of these columns might get past the plain logistic regression: the same one with
    ``ML_PROBE_CROSSES`` x item / genre crosses, its ``C`` picked on the evaluation rows (optimistic)."""
    fits = {c: logreg_auc(train_rows, eval_rows, columns, ML_PROBE_CROSSES, c)[0] for c in PROBE_C}
    best = max(fits, key=fits.__getitem__)
    return {"auc": fits[best], "c": best, "aucs_by_c": fits, "crosses": list(ML_PROBE_CROSSES)}


def baselines(root: Path, spec: Path, train_days: list[str], eval_days: list[str], probe: bool = False) -> dict:
    sources = batch_sources(spec)
    columns = sources[0]["columns"]
    started = time.perf_counter()
    train_rows = read_rows(root, sources, train_days)
    eval_rows = read_rows(root, sources, eval_days)
    label = columns["label"]
    pop = popularity_auc(train_rows, eval_rows, label)
    lr, lr_info = logreg_auc(train_rows, eval_rows, columns)
    extra = {"crosses_probe": crosses_probe(train_rows, eval_rows, columns)} if probe else {}
    return {
        "popularity": pop,
        "logreg": lr,
        "logreg_fit": lr_info,
        "eval_cold_user_share": round(cold_user_share(train_rows, eval_rows), 4),
        **extra,
        "train_rows": train_rows.num_rows,
        "eval_rows": eval_rows.num_rows,
        "train_label_rate": round(float(labels_of(train_rows, label).mean()), 5),
        "eval_label_rate": round(float(labels_of(eval_rows, label).mean()), 5),
        "wall_s": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------------------------------------- statistics


def interval(values: list[float]) -> list[float | None]:
    """``[mean, lo95, hi95]`` (t-interval over the values; null bounds with one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return [round(mean, 5), None, None]
    half = student_t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return [round(mean, 5), round(mean - half, 5), round(mean + half, 5)]


def at_least(ci: list[float | None], threshold: float, strict: bool = False) -> bool:
    """The interval's lower bound (the mean with one seed) at or above ``threshold`` (above: ``strict``)."""
    low = ci[1] if ci[1] is not None else ci[0]
    return bool(low > threshold) if strict else bool(low >= threshold - 1e-12)


def day_list(first: date, days: int) -> list[str]:
    return [(first + timedelta(days=i)).isoformat() for i in range(days)]


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


# ---------------------------------------------------------------------------------------------- the two data sets


def realistic_seed(seed: int, work: Path, args: argparse.Namespace) -> dict:
    root = work / f"realistic-s{seed}"
    root.mkdir(parents=True)
    day0, day1, day2 = (REALISTIC_START + timedelta(days=i) for i in range(3))
    world = ["--seed", str(seed), "--rows-per-hour", str(args.rows_per_hour), "--no-progress", "--json"]
    out: dict[str, Any] = {"seed": seed}
    broker = EmbeddedBroker().start()

    def synth(start: date, hours: int, *sources: str) -> int:
        """``primus-dagster synth --schema realistic`` of ``hours`` from ``start`` into ``sources``; rows."""
        command = [*cli(), "synth", "--schema", "realistic", "--spec", str(REALISTIC_SPEC), "--data-root", str(root)]
        command += [*world, "--start", start.isoformat(), "--hours", str(hours), "--sources", *sources]
        command += ["--kafka-bootstrap", broker.bootstrap_servers]
        summary = last_json(run(command, args.timeout).stdout)
        return sum(s["rows"] for s in summary["sources"].values())

    try:
        started = time.perf_counter()
        rows = {}
        for day in (day0, day2):  # the window's lagged batch day and the evaluation day: both batch shards
            rows[f"batch_{day.isoformat()}"] = synth(day, 24, "events_parquet", "events_delta")
        rows[f"stream_{day1.isoformat()}+1h"] = synth(day1, 25, "events_kafka")
        out["rows_written"] = rows
        out["synth_wall_s"] = round(time.perf_counter() - started, 1)
        log(f"realistic seed {seed}: wrote {rows} in {out['synth_wall_s']}s")
        for name, (mode, model_type) in REALISTIC_VARIANTS.items():
            if name not in args.variants:
                continue
            spec = variant_spec(
                REALISTIC_SPEC, root / f"job-{name}.yaml", mode=mode, model_type=model_type, seed=seed, eval_hours=24
            )
            meta = train(spec, midnight(day1), 24, root, f"real-schema/{name}/s{seed}", args, broker.bootstrap_servers)
            out[name] = model_record(meta)
            if name == "single" and seed == args.first_seed and args.noise_repeats:
                # the same spec, data and seed again: the run-to-run noise auc_tolerance must sit above
                again = [
                    train(spec, midnight(day1), 24, root, f"real-schema/{name}/s{seed}/again{k}", args,
                          broker.bootstrap_servers)["eval_auc"]
                    for k in range(args.noise_repeats)
                ]  # fmt: skip
                aucs = [meta["eval_auc"], *again]
                out["noise"] = {
                    "variant": name,
                    "aucs": [round(a, 6) for a in aucs],
                    "max_abs_diff": round(max(aucs) - min(aucs), 6),
                    "std": round(statistics.stdev(aucs), 6),
                }
                log(f"realistic seed {seed} {name}: identical runs {out['noise']}")
            log(
                f"realistic seed {seed} {name}: AUC {meta['eval_auc']:.4f} ({meta.get('samples')} samples, "
                f"{meta.get('eval_rows')} eval rows, {meta['bench_wall_s']}s) {meta['quality_line']}"
            )
    finally:
        broker.stop()
    base = baselines(root, REALISTIC_SPEC, [day0.isoformat()], [day2.isoformat()])
    out.update(popularity=base.pop("popularity"), logreg=base.pop("logreg"), baseline_info=base)
    first = out[args.variants[0]]
    log(
        f"realistic seed {seed}: popularity {out['popularity']:.4f} (pipeline's item prior "
        f"{first['pipeline_popularity_item_auc']}), logreg {out['logreg']:.4f} {base['logreg_fit']} "
        f"({base['train_rows']} train / {base['eval_rows']} eval rows, {base['wall_s']}s)"
    )
    if base["eval_rows"] != first["eval_rows"]:
        log(f"WARNING: baselines read {base['eval_rows']} eval rows, the train command {first['eval_rows']}")
    return out


def movielens(seeds: list[int], work: Path, args: argparse.Namespace) -> dict:
    root = work / "movielens-root"
    started = time.perf_counter()
    run([sys.executable, str(ML_CONVERT), "--out", str(root / "movielens"), "--json"], args.timeout)
    train_start, train_end = date.fromisoformat(args.ml_train_start), date.fromisoformat(args.ml_train_end)
    train_days = day_list(train_start, (train_end - train_start).days)
    eval_days = day_list(train_end, args.ml_eval_days)
    base = baselines(root, ML_SPEC, train_days, eval_days, probe=True)
    log(
        f"ml-100k: popularity {base['popularity']:.4f}, logreg {base['logreg']:.4f} {base['logreg_fit']}, "
        f"crosses probe {base['crosses_probe']['auc']:.4f} (C {base['crosses_probe']['c']}); "
        f"{base['eval_cold_user_share']:.0%} of the eval rows from users without a training row "
        f"({base['train_rows']} train / {base['eval_rows']} eval rows, {time.perf_counter() - started:.1f}s)"
    )
    per_seed = []
    for seed in seeds:
        spec = variant_spec(
            ML_SPEC, root / f"job-s{seed}.yaml", mode="batch", model_type="single", seed=seed,
            eval_hours=24 * args.ml_eval_days,
        )  # fmt: skip
        hours = 24 * len(train_days)
        meta = train(spec, midnight(train_start), hours, root, f"real-schema/ml-single/s{seed}", args, None)
        per_seed.append({"seed": seed, "single": model_record(meta)})
        log(
            f"ml-100k seed {seed} single: AUC {meta['eval_auc']:.4f} ({meta.get('samples')} samples, "
            f"{meta.get('eval_rows')} eval rows, {meta['bench_wall_s']}s) {meta['quality_line']}"
        )
    single = [p["single"]["auc"] for p in per_seed]
    diffs = {
        "single_minus_logreg": interval([s - base["logreg"] for s in single]),
        "logreg_minus_popularity": interval([base["logreg"] - base["popularity"]] * len(seeds)),
    }
    return {
        "dataset": "ml-100k",
        "auc": {
            "single": interval(single),
            "popularity": interval([base["popularity"]] * len(seeds)),
            "logreg": interval([base["logreg"]] * len(seeds)),
        },
        "diffs": diffs,
        "criteria": {
            "single_ge_logreg_plus_0.01": at_least(diffs["single_minus_logreg"], MARGIN),
            "logreg_gt_popularity": at_least(diffs["logreg_minus_popularity"], 0.0, strict=True),
        },
        "train_window": f"{train_days[0]}..{train_days[-1]}",
        "eval_window": f"{eval_days[0]}..{eval_days[-1]}",
        "train_rows": base["train_rows"],
        "eval_rows": base["eval_rows"],
        "eval_cold_user_share": base["eval_cold_user_share"],
        "logreg_crosses_probe_auc": round(base["crosses_probe"]["auc"], 5),
        "spec": "examples/movielens/job.yaml (mode batch, model single)",
        "baselines": base,
        "per_seed": per_seed,
        "note": "the data is fixed: only training.seed varies; the baselines are deterministic (one fit)",
    }


# ---------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="number of reported seeds (0..n-1)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds first..first+n-1 (tuning runs: 100 on; reported: 0)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec key in every variant (YAML value), e.g. training.learning_rate=0.003: tuning runs "
        "only; the JSON says spec_defaults_used false and lists them",
    )
    parser.add_argument(
        "--set-mtrm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="like --set, in the MTRM variants only (e.g. training.model.memory_lr_scale=3): tuning runs only",
    )
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=list(REALISTIC_VARIANTS),
        help=f"realistic-world variants to train, comma-separated (default: {','.join(REALISTIC_VARIANTS)})",
    )
    parser.add_argument("--quick", action="store_true", help=f"smoke run: seed 0, {QUICK_ROWS_PER_HOUR:g} rows/h")
    parser.add_argument(
        "--rows-per-hour", type=float, default=None, help="realistic world rows/h (default 20000, the world's)"
    )
    parser.add_argument("--executors", type=int, default=1, help="data executors per train run (0: the spec's)")
    parser.add_argument("--ml-train-start", default="1997-09-20", help="MovieLens first training day")
    parser.add_argument("--ml-train-end", default="1998-04-01", help="MovieLens first held-out day")
    parser.add_argument("--ml-eval-days", type=int, default=7)
    parser.add_argument(
        "--noise-repeats",
        type=int,
        default=2,
        help="train the first seed's single variant this many more times, unchanged: run-to-run noise",
    )
    parser.add_argument("--skip-movielens", action="store_true")
    parser.add_argument("--skip-realistic", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess")
    parser.add_argument("--keep", type=Path, default=None, help="work here (kept) instead of a temp dir")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.rows_per_hour is None:
        args.rows_per_hour = QUICK_ROWS_PER_HOUR if args.quick else 20000.0
    seeds = [args.first_seed] if args.quick else list(range(args.first_seed, args.first_seed + args.seeds))
    for item in args.set:
        key, _, value = item.partition("=")
        OVERRIDES[key] = yaml.safe_load(value)
    for item in args.set_mtrm:
        key, _, value = item.partition("=")
        MTRM_OVERRIDES[key] = yaml.safe_load(value)
    unknown = set(args.variants) - set(REALISTIC_VARIANTS)
    if unknown:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; choose from {list(REALISTIC_VARIANTS)}")
    wall0 = time.perf_counter()
    result: dict[str, Any] = {"bench": "real_schema", "seeds": seeds}
    with tempfile.TemporaryDirectory(prefix="real-schema-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        per_seed = []
        if not args.skip_realistic:
            for seed in seeds:
                per_seed.append(realistic_seed(seed, work, args))
        real = None if args.skip_movielens else movielens(seeds, work, args)
    if per_seed and set(args.variants) == set(REALISTIC_VARIANTS):
        values = {
            "single": [p["single"]["auc"] for p in per_seed],
            "mtrm_mixed": [p["mtrm_mixed"]["auc"] for p in per_seed],
            "popularity": [p["popularity"] for p in per_seed],
            "logreg": [p["logreg"] for p in per_seed],
        }
        diffs = {
            "single_minus_logreg": interval([a - b for a, b in zip(values["single"], values["logreg"], strict=True)]),
            "logreg_minus_popularity": interval(
                [a - b for a, b in zip(values["logreg"], values["popularity"], strict=True)]
            ),
            "mtrm_minus_single": interval([a - b for a, b in zip(values["mtrm_mixed"], values["single"], strict=True)]),
        }
        result["auc"] = {name: interval(v) for name, v in values.items()}
        result["diffs"] = diffs
        result["criteria"] = {
            "single_ge_logreg_plus_0.01": at_least(diffs["single_minus_logreg"], MARGIN),
            "logreg_gt_popularity": at_least(diffs["logreg_minus_popularity"], 0.0, strict=True),
            "mtrm_ge_single": at_least(diffs["mtrm_minus_single"], 0.0),
        }
    elif per_seed:  # a tuning run of some variants: their AUCs per seed, no criteria
        names = [*args.variants, "popularity", "logreg"]
        result["auc"] = {
            n: interval([p[n]["auc"] if isinstance(p[n], dict) else p[n] for p in per_seed]) for n in names
        }
        result.update(diffs=None, criteria=None)
    else:
        result.update(auc=None, diffs=None, criteria=None)
    result["run_to_run_noise"] = next((p["noise"] for p in per_seed if "noise" in p), None)
    result["real_data"] = real
    result["settings"] = {
        "quick": args.quick,
        "spec_defaults_used": not (OVERRIDES or MTRM_OVERRIDES),
        "tuning_overrides": OVERRIDES,
        "tuning_overrides_mtrm": MTRM_OVERRIDES,
        "variants": args.variants,
        "spec_overrides": ["training.mode", "training.model.type", "training.seed", "training.eval_hours"],
        "realistic": {
            "spec": "examples/realistic/job.yaml",
            "rows_per_hour": args.rows_per_hour,
            "days_written": {"batch": ["2026-11-01", "2026-11-03"], "stream": ["2026-11-02 (+ 1 h)"]},
            "train_window": "2026-11-02T00:00Z + 24h (mode mixed, batch_lag 24h: stream 2026-11-02, batch 2026-11-01)",
            "eval_window": "2026-11-03 (eval_hours 24, complete-label batch rows of both shards)",
            "baseline_train_rows": "batch rows of 2026-11-01 (both shards; the rows the window's batch part trains on)",
            "world_seed_equals_training_seed": True,
        },
        "executors": args.executors or "the spec's pools.data.replicas",
        "baselines": {
            "popularity": f"item like-rate, (pos + {SMOOTHING:g} * global) / (n + {SMOOTHING:g}), unseen: global",
            "logreg": f"LogisticRegression(max_iter={LOGREG_MAX_ITER}, C=1, lbfgs) on FeatureHasher({HASH_FEATURES}, "
            "alternate_sign=False) one-hot of column=value and genres=g + StandardScaler(sign*log1p(|x|)) dense",
        },
        "criteria_rule": "the paired 95% t-interval's lower bound >= threshold (> for logreg_gt_popularity); "
        "with one seed the mean",
        "per_seed": per_seed,
    }
    result["wall_s"] = round(time.perf_counter() - wall0, 1)
    emit(result)


if __name__ == "__main__":
    main()
