"""Per-write cost as a table's history grows (issue 18): many small upserts into one table.

Run from the repository root:

    .venv/bin/python benchmarks/bench_history.py                   # 1,000 upserts of 100 rows into 1M
    .venv/bin/python benchmarks/bench_history.py --writes 200 --rows 200000   # a quick look

What it does, in ONE process so both engines see the same machine load: starts an embedded
Postgres (the pyiceberg SQL catalog and the writer lock), writes the same base table of `--rows`
rows (`bench_iceberg_arm`'s 6 columns, one data file) with ours (`IcebergStore`, strategy
`snapshot_replace`: a re-deploy upserts) and with delta-rs (`write_deltalake`), then applies
`--writes` batches of `--batch` rows — half existing ids whose values change, half new ids — to
each, alternating ours / delta-rs (`merge` with matched update + not-matched insert).

It prints the median seconds per write in buckets of `--bucket` writes for both, the ratios the
issue sets targets for (last bucket / first bucket for ours; ours / delta-rs over the whole run and
over the last bucket), the metadata left behind (files and bytes under the table's `metadata/`,
the current `metadata.json`, manifests in the current snapshot, data files), the read time of the
table afterwards against the same rows freshly written (median of 5, interleaved), and checks that both
engines ended with the same rows.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_iceberg_arm import _rows, dir_stats, start_postgres

WORK = Path(__file__).resolve().parent / ".work" / "history"


def _batch(i: int, rows: int, size: int, next_id: int) -> Any:
    import polars as pl

    half = size // 2
    matched = pl.int_range(0, rows, eager=True).sample(half, seed=1000 + i)
    new = pl.int_range(next_id, next_id + size - half, eager=True)
    frame = pl.concat([_rows(matched, changed=True), _rows(new, changed=False)])
    # a distinct change per write, so a matched row really changes every time it is drawn
    return frame.with_columns(v_int=pl.col("v_int") + i)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--bucket", type=int, default=50)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import polars as pl
    from deltalake import DeltaTable, write_deltalake

    from pipeline_output import DatasetSpec, IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    server, sqlalchemy_uri, libpq_uri = start_postgres(WORK)
    try:
        catalog = FlatSqlCatalog("bench", uri=sqlalchemy_uri, warehouse=f"file://{WORK}/warehouse")
        store = IcebergStore(catalog, "bench", lock=AdvisoryLock(libpq_uri))
        spec = DatasetSpec(name="history", primary_key=("id",), strategy="snapshot_replace")
        delta_path = str(WORK / "delta" / "history")

        base = _rows(pl.int_range(0, args.rows, eager=True), changed=False)
        store.write(spec, base)
        write_deltalake(delta_path, base.to_arrow())

        ours: list[float] = []
        ours_cpu: list[float] = []  # this process's CPU seconds (all threads): load-independent
        delta: list[float] = []
        next_id = args.rows
        started = time.perf_counter()
        for i in range(args.writes):
            batch = _batch(i, args.rows, args.batch, next_id)
            next_id += args.batch - args.batch // 2
            t0, c0 = time.perf_counter(), time.process_time()
            store.write(spec, batch)
            ours.append(time.perf_counter() - t0)
            ours_cpu.append(time.process_time() - c0)
            arrow = batch.to_arrow()
            t0 = time.perf_counter()
            (
                DeltaTable(delta_path)
                .merge(source=arrow, predicate="t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
            delta.append(time.perf_counter() - t0)
            if (i + 1) % args.bucket == 0:
                print(
                    f"  {i + 1} writes, {time.perf_counter() - started:.0f} s: "
                    f"ours {statistics.median(ours[-args.bucket :]):.3f} s, "
                    f"delta-rs {statistics.median(delta[-args.bucket :]):.3f} s",
                    file=sys.stderr,
                    flush=True,
                )

        table = store.load(spec)
        assert table is not None
        location = Path(table.metadata.location.removeprefix("file://"))
        meta_files, meta_bytes = dir_stats(location / "metadata")
        kinds = {
            "metadata.json": sum(
                p.stat().st_size for p in (location / "metadata").glob("*.metadata.json")
            ),
            "manifest lists": sum(p.stat().st_size for p in (location / "metadata").glob("snap-*")),
        }
        kinds["manifests"] = meta_bytes - sum(kinds.values())
        delete_files = sum(len(t.delete_files) for t in table.scan().plan_files())
        current_json = Path(table.metadata_location.removeprefix("file://")).stat().st_size
        snapshot = table.current_snapshot()
        assert snapshot is not None
        manifests = len(snapshot.manifests(table.io))
        data_files = len(list(table.scan().plan_files()))
        delta_files = len(DeltaTable(delta_path).file_uris())

        rows_after = store.read(spec)
        fresh = DatasetSpec(name="history_fresh", primary_key=("id",), strategy="replace")
        store.write(fresh, rows_after)
        after_s: list[float] = []
        fresh_s: list[float] = []
        for _ in range(5):  # interleaved, so both see the same machine load
            for dataset, sink in ((spec, after_s), (fresh, fresh_s)):
                t0 = time.perf_counter()
                store.read(dataset)
                sink.append(time.perf_counter() - t0)
        read_after, read_fresh = statistics.median(after_s), statistics.median(fresh_s)
        same = rows_after.sort("id").equals(
            pl.from_arrow(DeltaTable(delta_path).to_pyarrow_table()).sort("id")  # type: ignore[union-attr]
        )
    finally:
        server.cleanup()
        shutil.rmtree(WORK, ignore_errors=True)

    b = args.bucket
    print(
        f"{args.writes} sequential upserts of {args.batch} rows ({args.batch // 2} matched, "
        f"{args.batch - args.batch // 2} new) into {args.rows:,} rows; python "
        f"{sys.version.split()[0]}; ours and delta-rs alternating in one process\n"
    )
    print("| writes | ours, median s | ours, median CPU s | delta-rs, median s | ours / delta-rs |")
    print("|---|---|---|---|---|")
    for lo in range(0, args.writes, b):
        o, d = statistics.median(ours[lo : lo + b]), statistics.median(delta[lo : lo + b])
        c = statistics.median(ours_cpu[lo : lo + b])
        print(
            f"| {lo}-{min(lo + b, args.writes) - 1} | {o:.3f} | {c:.3f} | {d:.3f} | {o / d:.2f}x |"
        )
    first, last = statistics.median(ours[:b]), statistics.median(ours[-b:])
    whole = statistics.median(ours) / statistics.median(delta)
    last_vs_delta = last / statistics.median(delta[-b:])
    print()

    def verdict(ok: bool) -> str:
        return "meets" if ok else "MISSES"

    cpu_first, cpu_last = statistics.median(ours_cpu[:b]), statistics.median(ours_cpu[-b:])
    print(
        f"- ours, last {b} writes / first {b}: {last / first:.2f}x wall (target ≤ 1.2x: "
        f"{verdict(last / first <= 1.2)}); {cpu_last / cpu_first:.2f}x in CPU seconds, which "
        "machine load does not inflate"
    )
    print(
        f"- ours / delta-rs, median over the run: {whole:.2f}x; over the last {b} writes: "
        f"{last_vs_delta:.2f}x (target ≤ 1x: {verdict(whole <= 1 and last_vs_delta <= 1)})"
    )
    print(
        f"- metadata after {args.writes} writes: {meta_files} files, {meta_bytes / 1e6:.1f} MB "
        f"under metadata/ (goal < 10 MB: {verdict(meta_bytes < 10e6)}); current metadata.json "
        f"{current_json / 1e6:.2f} MB; {manifests} manifest(s) in the current snapshot; "
        f"{data_files} data file(s), {delete_files} delete file(s) (delta-rs: {delta_files} "
        "data files)"
    )
    print(
        "- metadata bytes by kind: "
        + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in kinds.items())
        + f"; {meta_bytes / 1e3 / args.writes:.1f} KB per write"
    )
    print(
        f"- read afterwards {read_after:.3f} s vs the same rows freshly written {read_fresh:.3f} s: "
        f"{read_after / read_fresh:.2f}x (target ≤ 2x: {verdict(read_after / read_fresh <= 2)})"
    )
    print(f"- same rows as delta-rs at the end: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
