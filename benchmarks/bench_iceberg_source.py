"""What observing an Iceberg source and counting a window's rows cost: ours against pyiceberg's reader.

Run from the repository root:

    python benchmarks/bench_iceberg_source.py                  # 5,000,000 rows in 50 files, 5 reps
    python benchmarks/bench_iceberg_source.py --rows 500000 --files 10 --reps 3

What it does: starts an embedded Postgres in a temporary directory (pyiceberg SQL catalog; warehouse
on local disk), writes a table of `--rows` rows in `--files` appends (`id`, `seq`, `v`, `payload`,
`at`), then upserts every 20th row merge-on-read (a positional delete file on every data file, as
a table fed by upserts carries). Declared as `iceberg_source(..., watermark="seq")`, it is then
read as a window sensor and the source's observe function read it (`source_stats`: row count and
`max(seq)`; with no watermark, the row count alone) and as a window run's metadata counts it
(`iceberg_window_count`, a window of 10 % of the rows), timed in this process. The baseline is
what those functions did before, measured in the same run: pyiceberg's own reader
(`table.scan(selected_fields=...).to_arrow()`, every column when there is no watermark;
`table.scan(row_filter=...).count()`). Results are checked equal. Medians of `--reps`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _median_s(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(reps):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    from pipeline_output.infra import embedded_pg

    home = Path(tempfile.mkdtemp(prefix="bench-iceberg-source-"))
    url = embedded_pg.start(data_dir=home / "pg")
    try:
        os.environ["PIPELINE_OUTPUT_PG_URL"] = url
        os.environ["PIPELINE_OUTPUT_HOME"] = str(home / "home")
        import polars as pl

        from pipeline_output import DatasetSpec, Window
        from pipeline_output.dagster_layer.resource import get_runtime
        from pipeline_output.dagster_layer.source_assets import (
            iceberg_window_count,
            source_stats,
        )
        from pipeline_output.services.sources import SourceSpec
        from pipeline_output.stores.iceberg import window_filter

        runtime = get_runtime()
        store = runtime.iceberg
        per_file = args.rows // args.files

        def batch(i: int) -> pl.DataFrame:
            seq = pl.int_range(i * per_file + 1, (i + 1) * per_file + 1)
            return pl.select(
                id=seq,
                seq=seq,
                v=(seq * 7919) % 1_000_003,
                payload=pl.concat_str([seq.hash(3).cast(pl.String), pl.lit("-")]),
                at=pl.lit(datetime(2026, 1, 1, tzinfo=UTC)) + pl.duration(seconds=seq),
            )

        started = time.perf_counter()
        for i in range(args.files):
            store.write(DatasetSpec(name="src", strategy="append_always"), batch(i))
        keyed = DatasetSpec(
            name="src",
            primary_key=("id",),
            strategy="snapshot_replace",
            write_strategy_hint="merge-on-read",
        )
        changed = pl.concat([batch(i) for i in range(args.files)]).filter(pl.col("id") % 20 == 0)
        store.write(keyed, changed.with_columns(pl.col("v") + 1))
        setup_s = time.perf_counter() - started
        identifier = store.table_name("src")
        with_wm = SourceSpec(name="src", kind="iceberg", identifier=identifier, watermark="seq")
        no_wm = SourceSpec(name="src", kind="iceberg", identifier=identifier)
        window = Window(low=args.rows // 2, high=args.rows // 2 + args.rows // 10)

        def old_stats(watermark: str | None) -> tuple[int, Any]:
            table = runtime.catalog.load_table(identifier)
            fields = (watermark,) if watermark else ("*",)
            frame = pl.from_arrow(table.scan(selected_fields=fields).to_arrow())
            assert isinstance(frame, pl.DataFrame)
            return frame.height, frame[watermark].max() if watermark else None

        def old_count() -> int:
            table = runtime.catalog.load_table(identifier)
            bounds = window_filter("seq", window, schema=table.schema())
            return int(table.scan(row_filter=bounds).count())

        cases = [
            (
                "observe, watermark seq",
                lambda: old_stats("seq"),
                lambda: source_stats(with_wm, runtime=runtime),
            ),
            (
                "observe, no watermark",
                lambda: old_stats(None),
                lambda: source_stats(no_wm, runtime=runtime),
            ),
            (
                "window count (10 %)",
                old_count,
                lambda: iceberg_window_count(with_wm, window, runtime=runtime),
            ),
        ]
        print("== pipeline-output benchmark: reading an Iceberg source's stats ==")
        print(f"date:     {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} logical cores")
        print(
            f"table:    {args.rows:,} rows in {args.files} data files + {args.files} positional "
            f"delete files (every 20th row upserted), written in {setup_s:.0f} s (not timed)"
        )
        ok = True
        for name, old, new in cases:
            old_s, old_out = _median_s(old, args.reps)
            new_s, new_out = _median_s(new, args.reps)
            same = old_out == new_out
            ok = ok and same
            print(
                f"{name:<24} pyiceberg reader {old_s:7.3f} s   ours {new_s:7.3f} s   "
                f"{new_s / old_s:5.3f}x   result {new_out} ({'same' if same else 'DIFFERS'})"
            )
        print(f"checks (the same results): {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1
    finally:
        embedded_pg.stop(data_dir=home / "pg")


if __name__ == "__main__":
    raise SystemExit(main())
