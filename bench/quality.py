"""Model quality at time T: pure batch vs pure stream vs single-tower mixed vs MTRM mixed.

**Scenario (the Primus setting).** A training job has been running since ``start`` (2026-11-01
00:00 UTC) for ``--days`` days and reaches ``T = start + days * 24h``. The world is the seeded
synthetic CTR world (``docs/synthetic_world.md``): a stable user x item affinity, per-topic trends
that drift hour to hour (AR(1), rho = 0.8), a daily cycle, and label delay. At T the job has:

* the **stream copy** of every hour in ``[start, T)`` -- fresh, but a click counts only if it came
  within ``--stream-label-window`` (15 min: ~62 % of the clicks); an unlabelled row is a negative;
* the **batch copy** (complete labels, ``label_delay: 24h``) only of the hours in ``[start, T - 24h)``.

Every copy is turned into model inputs the way the data plane does it: the world's native table
-> ``Normalizer(source_spec)`` (a ``kind: batch`` parquet source for the batch copy, a ``kind:
stream`` kafka source for the stream copy, same column mapping as ``examples/job.yaml``) ->
``Batch.from_arrow(.., kind=kind)``. Rows stay in event-time order within an hour.

**Variants** -- per seed all four see the same world data, start from the same model seed, use
the same model sizes and optimiser (Adam, ``--lr``, micro-batches of ``--batch-size``: the
project's ``Trainer``) and make ONE pass over their data:

* ``batch``        -- ``SingleTower`` on the batch copies of ``[start, T - 24h)``, chronological
                      (complete labels, but at least 24 h stale);
* ``stream``       -- ``SingleTower`` on the stream copies of ``[start, T)``, chronological
                      (fresh, incomplete labels);
* ``single_mixed`` -- ``SingleTower`` on the mixed sequence: for each hour h in ``[start, T)`` the
                      stream copy of h and the batch copy of h - 24h (when h - 24h >= start)
                      interleaved micro-batch by micro-batch, spread evenly (micro-batch i of a
                      part with n micro-batches sits at position (i + 1/2) / n; ties -> batch
                      first): what ``training.mode: mixed`` with ``batch_lag: 24h`` and equal
                      priority weights feeds the trainer;
* ``mtrm_mixed``   -- ``MTRM`` on the same sequence (batch-kind micro-batches train the memory
                      tower, stream-kind ones the adapt tower with the detached memory state),
                      scored with its serving output (the adapt tower, ``model.predict``).

**Evaluation:** AUC and log loss of ``sigmoid(model.predict)`` on the batch copy (complete labels)
of the ``--eval-hours`` hours ``[T, T + eval_hours)``: pooled over those hours (the headline
figure) and per hour. The model is frozen at T, so later eval hours show how fast freshness decays
(trend correlation ~0.8 per hour). As references, the AUC of the generator's own click logit on
the same rows (``oracle_auc.full``: the ceiling) and of that logit without the current trend term
(``oracle_auc.no_trend``: the ceiling of a model that knows everything long-term and nothing of
this hour's trends).

**Shared defaults, not tuned per variant:** model sizes = ``ModelSpec`` defaults (examples/job.yaml:
embedding_dim 16, hash_buckets 100 000, memory_hidden [64, 32], adapt_hidden [128, 64] -- the
memory tower is the smaller one already, and its last hidden layer (32) is the ``h_aux`` the adapt
tower reads); batch_size 1024; Adam lr 5e-4 for every variant, chosen once by a one-seed sweep
(seed 1, 20 000 rows/h, the mean AUC of the four variants): 2.5e-4 -> 0.6985, 5e-4 -> 0.7042,
1e-3 (the TrainingSpec default) -> 0.7005, 3e-3 -> 0.6856; 5e-4 was the best or within 0.002 of the
best for each variant (mtrm_mixed alone preferred 1e-3 by 0.0016). torch runs single-threaded
(``--threads``): on the 2-core build machine, shared with other work, two intra-op threads made the
whole bench ~1.7x slower and were never faster for these small steps.

Last line: {"bench": "quality", "seeds": N, "auc": {"batch": [mean, std], "stream": [...],
"single_mixed": [...], "mtrm_mixed": [...]}, "oracle_auc": {"full": .., "no_trend": ..},
"auc_paired_delta": {"mtrm_mixed-single_mixed": [mean, std], ...},
"log_loss": {...}, "auc_per_eval_hour": {...}, "per_seed": {...}, "scenario": {...}, "wall_s": ...}
(std: sample standard deviation over seeds; 0 with one seed)
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

import numpy as np
import torch

from primus_dagster.data import Batch, Normalizer
from primus_dagster.spec import ModelSpec, TrainingSpec, format_duration, parse_duration, parse_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig
from primus_dagster.training.metrics import auc, log_loss
from primus_dagster.training.models import build_model, model_inputs, model_summary
from primus_dagster.training.trainer import Trainer

from _common import COLUMNS, emit

VARIANTS = ("batch", "stream", "single_mixed", "mtrm_mixed")
PAIRS = (
    ("mtrm_mixed", "single_mixed"),
    ("single_mixed", "stream"),
    ("single_mixed", "batch"),
    ("mtrm_mixed", "stream"),
    ("stream", "batch"),
)  # paired AUC differences (same world per seed)
MODEL_TYPE = {"batch": "single", "stream": "single", "single_mixed": "single", "mtrm_mixed": "mtrm"}

JOB = """
name: bench-quality
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 24h
      sources:
        - name: impressions
          type: parquet
          kind: batch
          label_delay: {max_delay}
          path: parquet/impressions
          columns: {columns}
    - name: live
      window: 1h
      sources:
        - name: events
          type: kafka
          kind: stream
          label_delay: {window}
          topic: events
          columns: {columns}
"""


def parse_seeds(text: str) -> list[int]:
    """``"3"`` -> seeds 1, 2, 3; ``"4,9,11"`` -> those seeds."""
    if "," in text:
        return [int(s) for s in text.split(",") if s.strip()]
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("--seeds must be >= 1 or a comma-separated list")
    return list(range(1, n + 1))


class SeedData:
    """The world of one seed as canonical batches: stream/batch copies per hour, eval hours."""

    def __init__(self, args: argparse.Namespace, seed: int):
        job = parse_job_spec(
            JOB.format(
                columns=COLUMNS,
                window=format_duration(args.stream_label_window),
                max_delay=format_duration(args.max_label_delay),
            ),
            "<bench quality>",
        )
        self.batch_norm = Normalizer(job.dataset.source("impressions"))
        self.stream_norm = Normalizer(job.dataset.source("events"))
        config = WorldConfig(
            seed=seed,
            users=args.users,
            items=args.items,
            rows_per_hour=args.rows_per_hour,
            trend_scale=args.trend_scale,
            affinity_scale=args.affinity_scale,
            stream_label_window=args.stream_label_window,
            max_label_delay=args.max_label_delay,
        )
        self.world = SyntheticWorld(config, job.dataset.start)
        self.hours = args.days * 24  # T, in hours from start
        self.lag = int(args.max_label_delay.total_seconds() // 3600)  # the batch copy's label delay
        self.stream: dict[int, Batch] = {}
        self.batch: dict[int, Batch] = {}
        self.eval: dict[int, Batch] = {}
        self.clicks = {"stream": 0, "batch_same_hours": 0}
        for h in range(self.hours):
            table = self.world.hour(h)
            stream = self.world.stream_copy(table)
            self.stream[h] = self._batch(self.stream_norm, stream, "stream")
            if h < self.hours - self.lag:  # batch copy complete at T only if h + lag <= T
                self.batch[h] = self._batch(self.batch_norm, table, "batch")
            self.clicks["stream"] += int(stream.column("click").to_numpy().sum())
            self.clicks["batch_same_hours"] += int(table.column("click").to_numpy().sum())
        self.oracle: dict[str, list[np.ndarray]] = {"full": [], "no_trend": []}
        for h in range(self.hours, self.hours + args.eval_hours):
            table = self.world.hour(h)
            self.eval[h] = self._batch(self.batch_norm, table, "batch")
            for name, logit in oracle_logits(self.world, table, h).items():
                self.oracle[name].append(logit)

    @staticmethod
    def _batch(norm: Normalizer, table, kind: str) -> Batch:
        out = Batch.from_arrow(norm(table.combine_chunks().to_batches()[0]), kind=kind)
        out.tensors  # noqa: B018 - converted once here; micro-batches are slices of these tensors
        return out

    def sequence(self, variant: str, batch_size: int) -> list[Batch]:
        """The micro-batches a variant trains on, in order (one pass)."""
        if variant == "batch":
            return [f for h in sorted(self.batch) for f in _micro(self.batch[h], batch_size)]
        if variant == "stream":
            return [f for h in range(self.hours) for f in _micro(self.stream[h], batch_size)]
        out: list[Batch] = []
        for h in range(self.hours):
            parts = [_micro(self.stream[h], batch_size)]
            if h - self.lag in self.batch:
                parts.insert(0, _micro(self.batch[h - self.lag], batch_size))
            out += interleave(parts)
        return out


def oracle_logits(world: SyntheticWorld, table, h: int) -> dict[str, np.ndarray]:
    """The generator's own click logit (``SyntheticWorld.click_logit``): ``full`` -- the ceiling of
    any model; ``no_trend`` -- without the current trend term, the ceiling of a model that knows
    everything long-term but nothing about this hour's trends."""
    return {"full": world.click_logit(table, h), "no_trend": world.click_logit(table, h, with_trend=False)}


def _micro(batch: Batch, size: int) -> list[Batch]:
    return [batch.slice(s, s + size) for s in range(0, batch.rows, size)]


def interleave(parts: list[list[Batch]]) -> list[Batch]:
    """Spread the parts evenly: item i of a part of n items at (i + 1/2) / n; ties keep part order."""
    keyed = [((i + 0.5) / len(p), k, f) for k, p in enumerate(parts) for i, f in enumerate(p)]
    return [f for _, _, f in sorted(keyed, key=lambda x: (x[0], x[1]))]


def evaluate_hours(model: torch.nn.Module, data: SeedData) -> dict:
    """Pooled and per-hour AUC / log loss of the serving output on the eval hours' batch copies."""
    model.eval()
    labels, probs, per_hour = [], [], []
    with torch.no_grad():
        for h in sorted(data.eval):
            dense, sparse, label = model_inputs(data.eval[h])
            p = torch.sigmoid(model.predict(dense, sparse))
            labels.append(label)
            probs.append(p)
            per_hour.append({"hour": h, "auc": auc(label, p), "log_loss": log_loss(label, p), "rows": len(label)})
    y, p = torch.cat(labels), torch.cat(probs)
    return {
        "auc": auc(y, p),
        "log_loss": log_loss(y, p),
        "mean_pred": float(p.mean()),
        "ctr": float(y.mean()),
        "per_hour": per_hour,
    }


def run_variant(args: argparse.Namespace, data: SeedData, seed: int, variant: str) -> dict:
    spec = ModelSpec(
        type=MODEL_TYPE[variant],
        embedding_dim=args.embedding_dim,
        hash_buckets=args.hash_buckets,
        memory_hidden=args.memory_hidden,
        adapt_hidden=args.adapt_hidden,
    )
    training = TrainingSpec(
        mode="mixed" if variant.endswith("mixed") else variant,
        model=spec,
        batch_size=args.batch_size,
        learning_rate=args.lr,
    )
    some = next(iter(data.stream.values()))
    model = build_model(spec, some.dense.shape[1], some.sparse.shape[1], seed=seed)
    trainer = Trainer(model, training)
    started = time.perf_counter()
    for micro in data.sequence(variant, args.batch_size):
        trainer.train_step(micro)
    train_s = time.perf_counter() - started
    result = evaluate_hours(model, data)
    stats = trainer.stats()
    result.update(
        train_s=round(train_s, 2),
        steps=stats["step"],
        samples_batch=stats["samples_batch"],
        samples_stream=stats["samples_stream"],
        params=model_summary(model)["params"],
    )
    return result


def mean_std(values: list[float]) -> list[float]:
    return [round(statistics.fmean(values), 5), round(statistics.stdev(values), 5) if len(values) > 1 else 0.0]


def print_table(per_seed: dict, seeds: list[int], eval_hours: int) -> None:
    header = (
        f"{'variant':14s} {'AUC mean':>9s} {'± std':>8s} {'logloss':>8s}  "
        + " ".join(f"{'seed ' + str(s):>9s}" for s in seeds)
        + "  "
        + " ".join(f"{'h+' + str(i):>7s}" for i in range(eval_hours))
    )
    print(header)
    print("-" * len(header))
    for v in VARIANTS:
        aucs = [per_seed[s][v]["auc"] for s in seeds]
        losses = [per_seed[s][v]["log_loss"] for s in seeds]
        m, sd = mean_std(aucs)
        hours = [statistics.fmean(per_seed[s][v]["per_hour"][i]["auc"] for s in seeds) for i in range(eval_hours)]
        print(
            f"{v:14s} {m:9.4f} {sd:8.4f} {statistics.fmean(losses):8.4f}  "
            + " ".join(f"{a:9.4f}" for a in aucs)
            + "  "
            + " ".join(f"{a:7.4f}" for a in hours)
        )
    print(f"(AUC pooled over the eval hours; h+i: AUC of eval hour i, mean over seeds; std over {len(seeds)} seeds)")
    for a, b in PAIRS:
        deltas = [per_seed[s][a]["auc"] - per_seed[s][b]["auc"] for s in seeds]
        m, sd = mean_std(deltas)
        print(f"  {a} - {b}: {m:+.4f} ± {sd:.4f}  per seed [" + " ".join(f"{d:+.4f}" for d in deltas) + "]")


def main() -> None:
    """Run every variant for every seed; print progress, a table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=parse_seeds("3"),
        help="N (seeds 1..N) or a comma-separated list of world/model seeds",
    )
    parser.add_argument("--days", type=int, default=3, help="the job has run this many days at T")
    parser.add_argument("--eval-hours", type=int, default=4, help="evaluate on the batch copy of [T, T + this)")
    parser.add_argument("--rows-per-hour", type=float, default=20_000.0, help="world: mean impressions per hour")
    parser.add_argument("--users", type=int, default=WorldConfig.users)
    parser.add_argument("--items", type=int, default=WorldConfig.items)
    parser.add_argument("--trend-scale", type=float, default=WorldConfig.trend_scale)
    parser.add_argument("--affinity-scale", type=float, default=WorldConfig.affinity_scale)
    parser.add_argument(
        "--stream-label-window", type=str, default="15m", help="clicks later than this are missing from the stream copy"
    )
    parser.add_argument(
        "--max-label-delay",
        type=str,
        default="24h",
        help="label delay of the batch copy (and the world's click-delay cap); whole hours",
    )
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate (all variants)")
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--hash-buckets", type=int, default=100_000)
    parser.add_argument("--memory-hidden", type=lambda s: [int(x) for x in s.split(",")], default=[64, 32])
    parser.add_argument("--adapt-hidden", type=lambda s: [int(x) for x in s.split(",")], default=[128, 64])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(VARIANTS),
        help="comma-separated subset (default: all four)",
    )
    args = parser.parse_args()
    args.stream_label_window = parse_duration(args.stream_label_window)
    args.max_label_delay = parse_duration(args.max_label_delay)
    if args.max_label_delay % timedelta(hours=1) or args.max_label_delay >= timedelta(days=args.days):
        parser.error("--max-label-delay must be whole hours and shorter than --days")
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    torch.set_num_threads(args.threads)

    wall0 = time.perf_counter()
    per_seed: dict[int, dict] = {}
    data_info: dict[int, dict] = {}
    for seed in args.seeds:
        t0 = time.perf_counter()
        data = SeedData(args, seed)
        rows = {
            "stream": sum(f.rows for f in data.stream.values()),
            "batch": sum(f.rows for f in data.batch.values()),
            "eval": sum(f.rows for f in data.eval.values()),
        }
        data_info[seed] = {"rows": rows, "clicks": data.clicks, "gen_s": round(time.perf_counter() - t0, 2)}
        print(
            f"seed {seed}: world ready in {time.perf_counter() - t0:.1f}s  rows {rows}  "
            f"stream/batch clicks {data.clicks['stream'] / max(1, data.clicks['batch_same_hours']):.3f}",
            flush=True,
        )
        labels = torch.cat([model_inputs(data.eval[h])[2] for h in sorted(data.eval)])
        oracle = {name: auc(labels, np.concatenate(parts)) for name, parts in data.oracle.items()}
        data_info[seed]["oracle_auc"] = {k: round(v, 5) for k, v in oracle.items()}
        print(
            f"  seed {seed} oracle AUC on the eval hours: generator's logit {oracle['full']:.4f}, "
            f"without the current trend {oracle['no_trend']:.4f}",
            flush=True,
        )
        per_seed[seed] = {}
        for variant in args.variants:
            r = run_variant(args, data, seed, variant)
            per_seed[seed][variant] = r
            hours = " ".join(f"{x['auc']:.4f}" for x in r["per_hour"])
            print(
                f"  seed {seed} {variant:13s} AUC {r['auc']:.4f}  logloss {r['log_loss']:.4f}  "
                f"pred {r['mean_pred']:.4f} vs ctr {r['ctr']:.4f}  per hour [{hours}]  "
                f"{r['steps']} steps in {r['train_s']:.1f}s",
                flush=True,
            )
        del data
    wall = time.perf_counter() - wall0

    seeds = args.seeds
    variants = [v for v in VARIANTS if v in args.variants]
    if set(variants) == set(VARIANTS):
        print()
        print_table(per_seed, seeds, args.eval_hours)
    result = {
        "bench": "quality",
        "seeds": len(seeds),
        "auc": {v: mean_std([per_seed[s][v]["auc"] for s in seeds]) for v in variants},
        "oracle_auc": {k: mean_std([data_info[s]["oracle_auc"][k] for s in seeds]) for k in ("full", "no_trend")},
        "auc_paired_delta": {
            f"{a}-{b}": mean_std([per_seed[s][a]["auc"] - per_seed[s][b]["auc"] for s in seeds])
            for a, b in PAIRS
            if a in variants and b in variants
        },
        "log_loss": {v: mean_std([per_seed[s][v]["log_loss"] for s in seeds]) for v in variants},
        "auc_per_eval_hour": {
            v: [
                round(statistics.fmean(per_seed[s][v]["per_hour"][i]["auc"] for s in seeds), 5)
                for i in range(args.eval_hours)
            ]
            for v in variants
        },
        "per_seed": {
            str(s): {
                v: {
                    "auc": round(per_seed[s][v]["auc"], 5),
                    "log_loss": round(per_seed[s][v]["log_loss"], 5),
                    "mean_pred": round(per_seed[s][v]["mean_pred"], 5),
                    "auc_per_hour": [round(x["auc"], 5) for x in per_seed[s][v]["per_hour"]],
                    "steps": per_seed[s][v]["steps"],
                    "train_s": per_seed[s][v]["train_s"],
                }
                for v in variants
            }
            | {"data": data_info[s]}
            for s in seeds
        },
        "scenario": {
            "seed_list": seeds,
            "days": args.days,
            "eval_hours": args.eval_hours,
            "rows_per_hour": args.rows_per_hour,
            "users": args.users,
            "items": args.items,
            "trend_scale": args.trend_scale,
            "affinity_scale": args.affinity_scale,
            "stream_label_window": format_duration(args.stream_label_window),
            "batch_label_delay": format_duration(args.max_label_delay),
            "batch_size": args.batch_size,
            "lr": args.lr,
            "embedding_dim": args.embedding_dim,
            "hash_buckets": args.hash_buckets,
            "memory_hidden": args.memory_hidden,
            "adapt_hidden": args.adapt_hidden,
            "threads": args.threads,
            "mixed_order": "per hour h: stream(h) + batch(h-24h) micro-batches spread evenly",
        },
        "wall_s": round(wall, 1),
    }
    emit(result)


if __name__ == "__main__":
    main()
