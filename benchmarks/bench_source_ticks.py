"""A window sensor's tick over a large Postgres source: idle, and with new rows.

Run from the repository root:

    python benchmarks/bench_source_ticks.py                  # 10,000,000 source rows, 7 ticks each
    python benchmarks/bench_source_ticks.py --rows 1000000 --ticks 3

What it does: starts an embedded Postgres in a temporary directory (source, window ledger, Iceberg
SQL catalog; warehouse on local disk), creates `public.ev(id, v, seq)` with `--rows` rows and an
index on the watermark column `seq` (as a legacy table fed by an increasing column has), plans
its windows with the real window sensor of a delta dataset over it (no `max_rows`: one window up
to the high-water mark), then times sensor evaluations (`build_sensor_context`, in this process):

- `idle`: a tick with the cursor the last tick left, nothing new in the source: the sensor reads
  the source's high-water mark (`max(seq)`, one index entry) and stops there;
- `read`: the same tick with the cursor's `upstream` version removed — what every tick over a
  source did before: the source read whole (`count(*)` and `max(seq)`), an observation recorded;
- `new rows`: a tick after one more row arrived (high-water mark moved): read, observed, and one
  window planned. Each is followed by the run of that window, not timed.

Also printed: `count(*), max(seq)` and `max(seq)` alone, timed in Postgres directly. Medians of
`--ticks` ticks; the ratios are against the `read` tick of the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--ticks", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import psycopg

    from pipeline_output.infra import embedded_pg

    home = Path(tempfile.mkdtemp(prefix="bench-source-ticks-"))
    url = embedded_pg.start(data_dir=home / "pg")
    try:
        os.environ["PIPELINE_OUTPUT_PG_URL"] = url
        os.environ["PIPELINE_OUTPUT_HOME"] = str(home / "home")
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE ev (id bigint PRIMARY KEY, v text NOT NULL, seq bigint)")
            conn.execute(
                "INSERT INTO ev SELECT g, 'v' || g, g FROM generate_series(1, %s) g", (args.rows,)
            )
            conn.execute("CREATE INDEX ev_seq ON ev (seq)")
            conn.execute("VACUUM ANALYZE ev")
        setup_s = time.perf_counter() - started

        import dagster as dg
        import polars as pl

        from pipeline_output import Delta, build_definitions, dataset, postgres_source
        from pipeline_output.dagster_layer.resource import get_runtime

        logging.getLogger("dagster").setLevel(logging.WARNING)

        @dataset(
            "ev_copy",
            strategy="append_always",
            mode="iceberg",
            delta=Delta(source="ev", watermark="seq"),
        )
        def ev_copy(ev: pl.LazyFrame) -> pl.DataFrame:
            return ev.select("id", "v", "seq").collect()

        defs = build_definitions(
            datasets=[ev_copy], sources=[postgres_source("ev", table="ev", watermark="seq")]
        )
        sensor = defs.get_sensor_def("ev_copy__window_sensor")
        job = defs.resolve_implicit_global_asset_job_def()
        times: dict[str, list[float]] = {"idle": [], "read": [], "new rows": []}
        observations: dict[str, list[int]] = {k: [] for k in times}
        with dg.DagsterInstance.ephemeral() as instance:

            def sensor_only(cursor: str | None) -> dg.SensorResult:
                context = dg.build_sensor_context(
                    instance=instance, definitions=defs, cursor=cursor
                )
                result = sensor(context)
                assert isinstance(result, dg.SensorResult)
                return result

            def apply(result: dg.SensorResult) -> None:
                """The tick's partitions added and its runs executed, as the daemon would."""
                for req in result.dynamic_partitions_requests or []:
                    instance.add_dynamic_partitions(
                        req.partitions_def_name, list(req.partition_keys)
                    )
                for request in result.run_requests or []:
                    assert job.execute_in_process(
                        instance=instance,
                        asset_selection=list(request.asset_selection or []),
                        partition_key=request.partition_key,
                        tags=request.tags,
                    ).success

            def observed(result: dg.SensorResult) -> int:
                return sum(isinstance(e, dg.AssetObservation) for e in result.asset_events)

            first = sensor_only(None)  # plans and applies the first window (not timed)
            apply(first)
            cursor = first.cursor
            next_id = args.rows + 1
            for _ in range(args.ticks):
                s, result = _timed(lambda c=cursor: sensor_only(c))
                times["idle"].append(s)
                observations["idle"].append(observed(result))
                kept = json.loads(cursor or "{}")
                stale = json.dumps({k: v for k, v in kept.items() if k != "upstream"})
                s, result = _timed(lambda c=stale: sensor_only(c))
                times["read"].append(s)
                observations["read"].append(observed(result))
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("INSERT INTO ev VALUES (%s, 'new', %s)", (next_id, next_id))
                next_id += 1
                s, result = _timed(lambda c=cursor: sensor_only(c))
                times["new rows"].append(s)
                observations["new rows"].append(observed(result))
                apply(result)
                cursor = result.cursor

        with psycopg.connect(url) as conn:
            count_s = statistics.median(
                _timed(lambda: conn.execute("SELECT count(*), max(seq) FROM ev").fetchone())[0]
                for _ in range(args.ticks)
            )
            max_s = statistics.median(
                _timed(lambda: conn.execute("SELECT max(seq) FROM ev").fetchone())[0]
                for _ in range(args.ticks)
            )
        ledger = get_runtime().windows.windows("ev_copy")
        ok = len(ledger) == args.ticks + 1 and all(w.state == "applied" for w in ledger)
        print("== pipeline-output benchmark: window sensor ticks over a large Postgres source ==")
        print(f"machine:  {os.cpu_count()} logical cores; python {sys.version.split()[0]}")
        print(f"source:   {args.rows:,} rows, index on seq, created in {setup_s:.0f} s")
        print(
            f"in Postgres: count(*), max(seq) {count_s * 1000:.1f} ms; max(seq) {max_s * 1000:.2f} ms"
        )
        base = statistics.median(times["read"])
        for name, values in times.items():
            med = statistics.median(values)
            print(
                f"tick {name:<9} median {med * 1000:8.1f} ms  ({min(values) * 1000:.1f}-"
                f"{max(values) * 1000:.1f})  {med / base:5.2f}x the read tick  "
                f"observations {sum(observations[name])}/{len(values)}"
            )
        print(f"checks (a window per new row, each applied): {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1
    finally:
        embedded_pg.stop(data_dir=home / "pg")


if __name__ == "__main__":
    raise SystemExit(main())
