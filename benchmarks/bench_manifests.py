"""Manifest pruning by partition summaries (issue 18): a keyed write into a table with years of
daily partitions reads only the manifests whose partition ranges can hold its keys.

Run from the repository root:

    .venv/bin/python benchmarks/bench_manifests.py                       # 40,000 days
    .venv/bin/python benchmarks/bench_manifests.py --days 8000 --appends 8   # a quick look

The table: key (`day`, `id`), partitioned by `identity(day)` (one data file per day, `--per-day`
rows each), built by `--appends` appends of consecutive days with the table's default manifest
settings (merging on, our 1 MiB target; `--manifest-target-bytes 8388608` for Iceberg's 8 MiB):
what years of daily loads leave, the old days merged into larger manifests whose partition
ranges are contiguous, the recent days in small ones.

Then, in ONE process, `--writes` upserts of `--batch` rows (half existing ids of one day whose
values change, half new ids) into a recent day and into an old day, alternating with pruning and
with pruning switched off (the benchmark replaces `merge.manifest_admission` by a function that
admits everything: every manifest's entries are read, as before issue 18's pruning). It prints
the median seconds per write of each, the manifests and entries a write reads, and checks that
both ended with the rows the polars oracle expects.
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

from bench_iceberg_arm import start_postgres

WORK = Path(__file__).resolve().parent / ".work" / "manifests"


def _day_rows(days: Any, per_day: int, *, version: int = 0) -> Any:
    import polars as pl

    frame = pl.DataFrame({"day": days}, schema={"day": pl.Int64}).join(
        pl.DataFrame({"id": range(per_day)}, schema={"id": pl.Int64}), how="cross"
    )
    return frame.with_columns(
        v=(pl.col("day") * 1_000 + pl.col("id") + version),
        note=pl.lit("n") + pl.col("id").cast(pl.String),
    )


def _batch(day: int, per_day: int, size: int, i: int) -> Any:
    import polars as pl

    old = _day_rows([day], per_day, version=i + 1).head(size // 2)
    new = _day_rows([day], size - size // 2, version=i + 1).with_columns(
        id=pl.col("id") + per_day + i * size
    )
    return pl.concat([old, new])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=40_000)
    parser.add_argument("--appends", type=int, default=20)
    parser.add_argument("--per-day", type=int, default=2)
    parser.add_argument("--writes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--manifest-target-bytes",
        type=int,
        default=None,
        help="the table's commit.manifest.target-size-bytes (default: ours, 1 MiB; Iceberg's "
        "is 8 MiB = 8388608)",
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import polars as pl

    from pipeline_output import DatasetSpec, IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.stores.iceberg.snapshot.manifests import read_index
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog
    from pipeline_output.stores.iceberg.write import merge

    pruning = merge.manifest_admission

    def admit_all(*_: Any) -> None:
        return None

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    server, sqlalchemy_uri, libpq_uri = start_postgres(WORK)
    try:
        catalog = FlatSqlCatalog("bench", uri=sqlalchemy_uri, warehouse=f"file://{WORK}/warehouse")
        store = IcebergStore(catalog, "bench", lock=AdvisoryLock(libpq_uri))
        key = ("day", "id")
        loads = DatasetSpec(
            name="daily", primary_key=key, strategy="append_always", partition_by=("day",)
        )
        upserts = DatasetSpec(name="daily", primary_key=key, partition_by=("day",))
        step = args.days // args.appends
        t0 = time.perf_counter()
        for a in range(args.appends):
            store.write(loads, _day_rows(range(a * step, (a + 1) * step), args.per_day))
            if a == 0 and args.manifest_target_bytes is not None:
                table = store.load(loads)
                assert table is not None
                with table.transaction() as tx:
                    tx.set_properties(
                        {"commit.manifest.target-size-bytes": str(args.manifest_target_bytes)}
                    )
        build_s = time.perf_counter() - t0
        expected = _day_rows(range(args.appends * step), args.per_day)

        table = store.load(loads)
        assert table is not None
        index = read_index(table)
        shape = [
            (m.content.name, m.existing_files_count + m.added_files_count) for m in index.manifests
        ]

        recent, old = args.appends * step - 1, 1
        timings: dict[tuple[str, str], list[float]] = {}
        reads: dict[tuple[str, str], tuple[int, int]] = {}
        n = 0
        for i in range(args.writes):
            for where, day in (("recent day", recent), ("old day", old)):
                for mode, admission in (("pruned", pruning), ("all manifests", admit_all)):
                    batch = _batch(day, args.per_day, args.batch, n)
                    n += 1
                    merge.manifest_admission = admission  # type: ignore[assignment]
                    t0 = time.perf_counter()
                    store.write(upserts, batch)
                    timings.setdefault((where, mode), []).append(time.perf_counter() - t0)
                    expected = pl.concat([expected.join(batch, on=list(key), how="anti"), batch])
                    if i == 0:  # what planning reads, on the table as it is now
                        table = store.load(loads)
                        assert table is not None
                        probe = read_index(table)
                        t = probe.tasks(admit=admission(table.metadata, upserts, batch))
                        entries = sum(
                            len(probe.live[m.manifest_path]) for m in probe.read_manifests()
                        )
                        reads[(where, mode)] = (len(probe.read_manifests()), entries)
                        assert t
        merge.manifest_admission = pruning  # type: ignore[assignment]
        got = store.read(loads)
        same = got.sort(list(key)).equals(expected.select(got.columns).sort(list(key)))
        table = store.load(loads)
        assert table is not None
        manifests_after = len(read_index(table).manifests)
    finally:
        server.cleanup()
        shutil.rmtree(WORK, ignore_errors=True)

    files = args.appends * step
    print(
        f"a table of {files:,} daily partitions ({files * args.per_day:,} rows, one data file per "
        f"day) built by {args.appends} appends in {build_s:.0f} s; manifest target "
        f"{args.manifest_target_bytes or 2**20:,} bytes; current manifests: "
        + ", ".join(f"{c.lower()} {k:,} files" for c, k in shape)
        + f"; python {sys.version.split()[0]}\n"
    )
    print(
        f"{args.writes} upserts of {args.batch} rows per case (half matched), cases alternating "
        "in one process\n"
    )
    print(
        "| upsert into | manifests read (entries) | pruned, median s | all manifests, median s | pruned / all |"
    )
    print("|---|---|---|---|---|")
    for where in ("recent day", "old day"):
        p = statistics.median(timings[(where, "pruned")])
        a = statistics.median(timings[(where, "all manifests")])
        rm, re_ = reads[(where, "pruned")]
        am, ae = reads[(where, "all manifests")]
        print(f"| {where} | {rm} ({re_:,}) vs {am} ({ae:,}) | {p:.3f} | {a:.3f} | {p / a:.2f}x |")
    print(
        f"\n- rows after {n} upserts equal the polars oracle: {same}; manifests in the current "
        f"snapshot afterwards: {manifests_after}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
