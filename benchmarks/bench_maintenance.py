"""Table maintenance (issue 14): a table after many window appends, before and after `compact` +
`expire_snapshots`, and compaction throughput against rewriting the table with our replace.

Run from the repository root:

    .venv/bin/python benchmarks/bench_maintenance.py                       # 1,000 windows of 1,000 rows
    .venv/bin/python benchmarks/bench_maintenance.py --windows 100 --rows 1000   # a quick look

What it does, in ONE process (same machine load for every number): starts an embedded Postgres
(the pyiceberg SQL catalog — the project's default `FlatSqlCatalog` — and the writer lock), then
applies `--windows` window writes of `--rows` new rows each (`bench_iceberg_arm`'s 6 columns,
windowed on `id`, strategy `snapshot_replace`: every window upserts into the table, adding one
data file and one snapshot), exactly as delta windows arrive.

Measured on that table, then again after `compact()` and `expire_snapshots(older_than=0,
retain_last=1)`:

- read: a full scan through `IcebergStore.read` (median of 3);
- upserts (median of 3, each a different batch): `spread` — 1,000 rows, half existing ids drawn
  uniformly over the whole table, half new; `recent` — 1,000 rows, half existing ids of the last
  window, half new (the windowed-delta pattern);
- metadata: what a reader reads before any data (current `metadata.json` + manifest list +
  manifests), every file and byte under the table's `metadata/` directory, data files, snapshots.

Compaction throughput is rows rewritten per second by `compact()` on the fragmented table;
"rewrite with our replace" is the same rows read back with `IcebergStore.read` and written by a
first-deploy replace into a fresh table (the way to defragment without compaction: read every
file, sort, write, one commit), timed on the same fragmented table just before compaction.
Every number is from this run; the rows are checked equal (as multisets) across the phases.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_iceberg_arm import _rows, dir_stats, machine, start_postgres

WORK = Path(__file__).resolve().parent / ".work" / "maintenance"


def _median(fn: Callable[[int], Any], n: int = 3) -> float:
    times = []
    for i in range(n):
        started = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import polars as pl

    from pipeline_output import DatasetSpec, Delta, IcebergStore, Window
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.stores.iceberg.maintenance.health import table_health
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    server, sqlalchemy_uri, libpq_uri = start_postgres(WORK)
    try:
        for line in machine(libpq_uri):
            print(line)
        catalog = FlatSqlCatalog("bench", uri=sqlalchemy_uri, warehouse=f"file://{WORK}/wh")
        catalog.create_namespace("bench")
        store = IcebergStore(catalog, "bench", lock=AdvisoryLock(libpq_uri))
        spec = DatasetSpec(
            name="events",
            primary_key=("id",),
            strategy="snapshot_replace",
            delta=Delta(source="raw", watermark="id"),
        )
        twin = replace(spec, name="events_twin")  # the same windows: upserts are timed on it
        n, size = args.windows, args.rows
        total = n * size

        started = time.perf_counter()
        for w in range(n):
            ids = pl.int_range(w * size + 1, (w + 1) * size + 1, eager=True)
            window = Window(w * size, (w + 1) * size)
            for target in (spec, twin):
                store.write(target, _rows(ids, changed=False), window=window)
            if (w + 1) % 100 == 0:
                print(f"  {w + 1} windows written ({time.perf_counter() - started:.1f} s)")
        append_s = (time.perf_counter() - started) / 2
        print(
            f"\n{n} window appends of {size} rows: {append_s:.1f} s per table "
            f"({append_s / n * 1000:.0f} ms per window)\n"
        )

        next_id = [total + 1]

        def upsert(target: DatasetSpec, matched: Any) -> None:
            new = pl.int_range(next_id[0], next_id[0] + size - size // 2, eager=True)
            next_id[0] += size - size // 2
            batch = pl.concat([_rows(matched, changed=True), _rows(new, changed=False)])
            store.write(target, batch.sample(fraction=1.0, seed=next_id[0]))

        def upserts(target: DatasetSpec, row: dict[str, Any]) -> None:
            everywhere = pl.int_range(1, total + 1, eager=True)
            last = pl.int_range(total - size + 1, total + 1, eager=True)
            row["upsert spread s"] = _median(
                lambda i: upsert(target, everywhere.sample(size // 2, seed=10 + i))
            )
            row["upsert recent s"] = _median(
                lambda i: upsert(target, last.sample(size // 2, seed=20 + i))
            )

        def static(target: DatasetSpec, label: str) -> dict[str, Any]:
            table = store.load(target)
            assert table is not None
            health = table_health(table)
            location = Path(table.location().removeprefix("file://"))
            meta_files, meta_bytes = dir_stats(location / "metadata")
            all_files, _ = dir_stats(location)
            return {
                "phase": label,
                "data files": health.data_files,
                "snapshots": health.snapshots,
                "files under the table": all_files,
                "metadata read (KiB)": health.metadata_bytes / 1024,
                "current metadata.json KiB": health.metadata_json_bytes / 1024,
                "metadata/ dir (MiB)": meta_bytes / 2**20,
                "metadata/ dir files": meta_files,
                "read s": _median(lambda _i: store.read(target)),
            }

        before = static(spec, "after the windows")
        contents = store.read(spec)

        started = time.perf_counter()
        frame = store.read(spec)
        store.write(DatasetSpec(name="rewritten", primary_key=("id",), strategy="replace"), frame)
        replace_s = time.perf_counter() - started

        result = store.compact(twin)
        print(result.describe(), f"in {result.duration_s:.2f} s")
        expiry = store.expire_snapshots(twin, older_than=timedelta(0))
        print(expiry.describe(), f"in {expiry.duration_s:.2f} s")
        compacted = store.read(twin)
        assert compacted.sort("id").equals(contents.sort("id")), "compaction changed rows"
        after = static(twin, "after compact + expire")
        upserts(spec, before)
        upserts(twin, after)

        print()
        keys = [k for k in before if k != "phase"]
        print(f"{'':<28}" + "".join(f"{row['phase']:>24}" for row in (before, after)))
        for key in keys:
            cells = []
            for row in (before, after):
                value = row[key]
                cells.append(f"{value:>24.3f}" if isinstance(value, float) else f"{value:>24}")
            print(f"{key:<28}" + "".join(cells))
        rows = result.rows
        print(
            f"\ncompact(): {result.files_rewritten} files, {rows} rows in "
            f"{result.duration_s:.2f} s = {rows / result.duration_s:,.0f} rows/s"
        )
        print(
            f"rewrite with our replace (read all + replace into a fresh table): "
            f"{frame.height} rows in {replace_s:.2f} s = {frame.height / replace_s:,.0f} rows/s"
        )
        print(
            f"expire_snapshots(): {expiry.snapshots_expired} snapshots expired, "
            f"{expiry.files_deleted} files deleted in {expiry.duration_s:.2f} s"
        )
    finally:
        server.cleanup()
        shutil.rmtree(WORK, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
