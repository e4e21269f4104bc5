"""Per-window overhead of a single-run backfill over many small delta windows (issue 6).

Run from the repository root:

    .venv/bin/python benchmarks/bench_windows.py                 # 200 windows of 1 row
    .venv/bin/python benchmarks/bench_windows.py --windows 500 --rows-per-window 100

What it does: starts an embedded Postgres in a temporary directory (sources, window ledger,
Iceberg SQL catalog all on it, warehouse on local disk), creates `public.ev` with
`windows * rows_per_window` rows, plans the windows with the dataset's real window sensor
(`Delta(max_rows=rows_per_window)`), then applies them all in ONE Dagster run (a partition-range
backfill, `execute_in_process` on an ephemeral instance) and prints the total and per-window
seconds. A second, identical range run (every window already applied: the no-op path) is timed too.
It then checks the result: one ledger row and one Iceberg snapshot per window, rows exactly once.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--rows-per-window", type=int, default=1)
    parser.add_argument(
        "--strategy",
        default="append_always",
        choices=["append_always", "snapshot_replace", "append_new", "sync", "replace"],
        help="the dataset's strategy (keyed on id): snapshot_replace upserts every window",
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import logging

    import psycopg

    from pipeline_output.infra import embedded_pg

    home = Path(tempfile.mkdtemp(prefix="bench-windows-"))
    url = embedded_pg.start(data_dir=home / "pg")
    try:
        os.environ["PIPELINE_OUTPUT_PG_URL"] = url
        os.environ["PIPELINE_OUTPUT_HOME"] = str(home / "home")
        os.environ.pop("PIPELINE_OUTPUT_FAULT", None)
        total_rows = args.windows * args.rows_per_window
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE ev (id bigint PRIMARY KEY, v text NOT NULL, seq bigint)")
            conn.execute(
                "INSERT INTO ev SELECT g, 'v' || g, g FROM generate_series(1, %s) g",
                (total_rows,),
            )

        import dagster as dg
        import polars as pl

        from pipeline_output import Delta, build_definitions, dataset, postgres_source
        from pipeline_output.dagster_layer.resource import get_runtime

        logging.getLogger("dagster").setLevel(logging.WARNING)
        raw = postgres_source("ev", table="ev", watermark="seq")

        @dataset(
            "ev_copy",
            strategy=args.strategy,
            primary_key="id",
            mode="iceberg",
            delta=Delta(source="ev", watermark="seq", max_rows=args.rows_per_window),
        )
        def ev_copy(ev: pl.LazyFrame) -> pl.DataFrame:
            return ev.select("id", "v", "seq").collect()

        defs = build_definitions(datasets=[ev_copy], sources=[raw])
        job = defs.resolve_implicit_global_asset_job_def()
        with dg.DagsterInstance.ephemeral() as instance:
            t0 = time.perf_counter()
            sensor = defs.get_sensor_def("ev_copy__window_sensor")
            result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
            for req in result.dynamic_partitions_requests or []:
                instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
            keys = sorted(instance.get_dynamic_partitions("ev_copy__windows"))
            plan_s = time.perf_counter() - t0
            assert len(keys) == args.windows, (len(keys), args.windows)
            tags = {
                "dagster/asset_partition_range_start": keys[0],
                "dagster/asset_partition_range_end": keys[-1],
            }

            def backfill() -> float:
                started = time.perf_counter()
                out = job.execute_in_process(
                    instance=instance, asset_selection=[dg.AssetKey("ev_copy")], tags=tags
                )
                assert out.success
                return time.perf_counter() - started

            apply_s = backfill()
            noop_s = backfill()

        runtime = get_runtime()
        ledger = runtime.windows.windows("ev_copy")
        table = runtime.iceberg.load("ev_copy")
        assert table is not None
        snaps = table.snapshots()
        # per-window time: the gap between consecutive windows' snapshots (commit to commit)
        stamps = sorted(s.timestamp_ms for s in snaps)
        gaps = [(b - a) / 1000 for a, b in itertools.pairwise(stamps)]
        k = min(20, max(1, len(gaps) // 2))
        first_k, last_k = statistics.median(gaps[:k]), statistics.median(gaps[-k:])
        rows = runtime.iceberg.read("ev_copy")
        ok = (
            len(ledger) == args.windows
            and all(w.state == "applied" for w in ledger)
            and len(snaps) == args.windows
            and rows.height == total_rows
            and rows["id"].n_unique() == total_rows
        )
        n = args.windows
        print(
            f"windows: {n} x {args.rows_per_window} row(s), strategy {args.strategy}; "
            f"python {sys.version.split()[0]}"
        )
        print(f"plan (sensor evaluation, {n} windows): {plan_s:.2f} s")
        print(f"apply, one range run: {apply_s:.2f} s total, {apply_s / n:.3f} s per window")
        print(f"re-run, all applied (no-op): {noop_s:.2f} s total, {noop_s / n:.3f} s per window")
        print(
            f"per window (commit to commit), median of the first {k}: {first_k:.3f} s, of the "
            f"last {k}: {last_k:.3f} s: {last_k / first_k:.2f}x (target <= 1.2x: "
            f"{'meets' if last_k / first_k <= 1.2 else 'MISSES'})"
        )
        print(
            f"checks (1 ledger row + 1 snapshot per window, rows once): {'ok' if ok else 'FAILED'}"
        )
        return 0 if ok else 1
    finally:
        embedded_pg.stop(data_dir=home / "pg")


if __name__ == "__main__":
    raise SystemExit(main())
