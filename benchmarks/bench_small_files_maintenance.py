"""Maintenance of a table of MANY small files, ours vs delta-rs and vs the floor (issue 45).

Run from the repository root:

    .venv/bin/python benchmarks/bench_small_files_maintenance.py               # 20,000 files of 50 rows
    .venv/bin/python benchmarks/bench_small_files_maintenance.py --files 2000  # a quick look
    .venv/bin/python benchmarks/bench_small_files_maintenance.py --partitions 200 --files 20000

The table: F data files of R rows each (`bench_small_files`' builder: file j holds the ids
[j*R, (j+1)*R), the 6 columns of `bench_iceberg_arm._rows`), unpartitioned — or, with
`--partitions P`, identity-partitioned on a `part` column (file j in partition j mod P, F/P files
per partition). Ours is committed 1,000 files at a time (1 + F/1000 snapshots, F/1000
manifests); delta-rs's is the same Parquet files converted in place (`convert_to_deltalake`).

Measured, each in its own fresh process (only the call is timed, from the table's name to done:
ours makes its store and loads the table inside it, delta-rs opens the table inside it — the
open replays its log, `open_s`; peak RSS is the process's VmHWM, interpreter and imports
included; `+N` the growth over the call):

- compaction: ours `IcebergStore.compact` (one bin per target size, sorted by the key, one
  `replace` commit) vs delta-rs `DeltaTable.optimize.compact()`, and vs the floor: polars reading
  every data file of our table with its native multi-file scan (`pl.scan_parquet`) and writing the
  rows once as one Parquet file — measured in the same run;
- expiry + orphans: ours `expire_snapshots(older_than=0, retain_last=1)` (every snapshot but the
  compaction's, and the files only they referenced: the F small files, the manifests and
  manifest lists) then `remove_orphans(grace_s=0)` vs delta-rs `vacuum(retention_hours=0)`
  (deletes the F files the compaction removed).

Both tables are checked after compaction (F*R rows, unique ids) and after cleanup (only the
compacted files left). Ratios within this run. Targets (issue 45): compaction <= 0.5x delta-rs
and <= 1.5x the floor, peak RSS <= delta-rs's; expiry + orphans <= 0.5x vacuum.
Nothing outside `benchmarks/.work/small_maintenance/` (git-ignored) is touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_iceberg_arm import _rows, fmt_mb, fmt_s, machine, start_postgres
from bench_spread import measure, ours_store
from bench_spread import spawn as spawn_child

HERE = Path(__file__).resolve().parent
NAME = "small"
COMMIT_FILES = 1000


def _file_frame(j: int, per: int, partitions: int) -> Any:
    import polars as pl

    frame = _rows(pl.int_range(j * per, (j + 1) * per, eager=True), changed=False)
    if partitions:
        frame = frame.with_columns(part=pl.lit(j % partitions, dtype=pl.Int64))
    return frame


def _file_order(files: int, partitions: int) -> list[int]:
    """Files by partition when partitioned (a commit's manifests then cover few partitions)."""
    if not partitions:
        return list(range(files))
    return sorted(range(files), key=lambda j: (j % partitions, j))


def prep(cfg: dict[str, Any], engine: str) -> dict[str, Any]:
    """The table of `files` small files for `engine` (not timed)."""
    files, per, parts = cfg["files"], cfg["per_file"], cfg["partitions"]
    order = _file_order(files, parts)
    if engine == "delta":
        from deltalake import DeltaTable, convert_to_deltalake

        folder = Path(cfg["delta_root"]) / NAME
        for j in order:
            target = folder / f"part={j % parts}" if parts else folder
            target.mkdir(parents=True, exist_ok=True)
            frame = _file_frame(j, per, parts)
            (frame.drop("part") if parts else frame).write_parquet(target / f"f-{j:06d}.parquet")
        if parts:
            import pyarrow as pa
            from deltalake import Schema

            convert_to_deltalake(
                str(folder),
                partition_by=Schema.from_arrow(pa.schema([("part", pa.int64())])),
                partition_strategy="hive",
            )
        else:
            convert_to_deltalake(str(folder))
        return {"files": len(DeltaTable(str(folder)).file_uris())}

    import uuid

    from pipeline_output.stores.iceberg.snapshot.commit import CommitRequest, commit
    from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
    from pipeline_output.stores.iceberg.snapshot.manifests import FlatTransaction

    store = ours_store(cfg)
    spec = ours_spec(cfg)
    store.write(spec, _file_frame(order[0], per, parts))
    for start in range(1, files, COMMIT_FILES):
        table = store.load(NAME)
        tx = FlatTransaction(table)
        writer = DataFileWriter(tx.table_metadata, table.io, write_id=uuid.uuid4())
        ready = []
        for j in order[start : start + COMMIT_FILES]:
            ready.extend(writer.write(_file_frame(j, per, parts)))
        commit(CommitRequest(tx=tx, dataset=NAME, properties={}, ready=ready, blind_retry=True))
    table = store.load(NAME)
    return {
        "files": len(list(table.scan().plan_files())),
        "snapshots": len(table.metadata.snapshots),
        "data": sorted(
            str(p) for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")
        ),
    }


def ours_spec(cfg: dict[str, Any], strategy: str = "append_always") -> Any:
    from pipeline_output import DatasetSpec

    if cfg["partitions"]:
        return DatasetSpec(
            name=NAME, primary_key=("id",), strategy=strategy, partition_by=("part",)
        )
    return DatasetSpec(name=NAME, primary_key=("id",), strategy=strategy)


def counts(cfg: dict[str, Any], engine: str) -> dict[str, int]:
    """Rows, distinct ids and live data files of the table now."""
    if engine == "ours":
        store = ours_store(cfg)
        ids = store.read(NAME, columns=["id"])["id"]
        files = len(list(store.load(NAME).scan().plan_files()))
        return {"rows": ids.len(), "ids": ids.n_unique(), "files": files}
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(str(Path(cfg["delta_root"]) / NAME))
    arrow_ids = table.to_pyarrow_dataset().to_table(columns=["id"])["id"]
    return {
        "rows": len(arrow_ids),
        "ids": pc.count_distinct(arrow_ids).as_py(),
        "files": len(table.file_uris()),
    }


def files_on_disk(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


def timed(cfg: dict[str, Any], what: str, engine: str) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    if what == "floor":
        import polars as pl

        data = cfg["data"]
        out = Path(cfg["delta_root"]).parent / "floor.parquet"

        def floor() -> None:
            pl.scan_parquet(data).sink_parquet(out)

        measured = measure(floor)
        detail["rows"] = pl.scan_parquet(out).select(pl.len()).collect().item()
        out.unlink()
        return {**measured, "detail": detail}
    if engine == "ours":
        from datetime import timedelta

        from pipeline_output import IcebergStore  # noqa: F401  (imported before the timing)
        from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog  # noqa: F401

        spec = ours_spec(cfg)
        if what == "compact":

            def call() -> None:
                store = ours_store(cfg)
                result = store.compact(spec)
                detail["result"] = result.describe()

        else:

            def call() -> None:
                store = ours_store(cfg)
                expiry = store.expire_snapshots(spec, older_than=timedelta(0), retain_last=1)
                detail["expiry"] = f"{expiry.describe()} in {expiry.duration_s:.2f} s"
                orphans = store.remove_orphans(spec, grace_s=0)
                detail["orphans"] = f"{orphans.describe()} in {orphans.duration_s:.2f} s"

        measured = measure(call)
        table = ours_store(cfg).load(NAME)
        detail["on disk"] = files_on_disk(Path(table.location().removeprefix("file://")))
    else:
        from deltalake import DeltaTable

        path = str(Path(cfg["delta_root"]) / NAME)

        def opened() -> Any:
            """The table, opened inside the timed call as ours is loaded inside it: opening
            replays the log (the 20,000 adds, the optimize's 20,000 removes)."""
            started = time.perf_counter()
            table = DeltaTable(path)
            detail["open_s"] = round(time.perf_counter() - started, 3)
            return table

        if what == "compact":

            def call() -> None:
                table = opened()
                detail["result"] = {
                    k: v
                    for k, v in table.optimize.compact().items()
                    if k in ("numFilesAdded", "numFilesRemoved")
                }

        else:

            def call() -> None:
                table = opened()
                gone = table.vacuum(
                    retention_hours=0, enforce_retention_duration=False, dry_run=False
                )
                detail["result"] = f"vacuum deleted {len(gone)} file(s)"

        measured = measure(call)
        detail["on disk"] = files_on_disk(Path(path))
    detail["check"] = counts(cfg, engine)
    return {**measured, "detail": detail}


def child_main(payload_path: str) -> None:
    import json
    import warnings

    warnings.simplefilter("ignore")
    p = json.loads(Path(payload_path).read_text())
    if p["what"] == "prep":
        result = prep(p["cfg"], p["engine"])
    else:
        result = timed(p["cfg"], p["what"], p["engine"])
    print(json.dumps(result), flush=True)
    os._exit(0)  # (deltalake's runtime can abort at interpreter exit: the result is out)


def spawn(payload: dict[str, Any], tag: str, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """This script as a fresh child on `payload` (`bench_spread.spawn`)."""
    return spawn_child(payload, tag, workdir, timeout_s, script=Path(__file__))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--per-file", type=int, default=50)
    ap.add_argument("--partitions", type=int, default=0)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    workdir = HERE / ".work" / "small_maintenance"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    wall = time.perf_counter()
    server, sqlalchemy_uri, libpq_uri = start_postgres(workdir)
    rows = args.files * args.per_file
    failed = False
    try:
        print("== pipeline-output benchmark: maintenance of a table of small files ==")
        for ln in machine(libpq_uri):
            print(ln)
        layout = f"{args.partitions} partitions" if args.partitions else "unpartitioned"
        print(
            f"table:    {args.files:,} files of {args.per_file} rows ({rows:,} rows), {layout}; "
            "each measurement a fresh process\n",
            flush=True,
        )
        cfg: dict[str, Any] = {
            "sqlalchemy_uri": sqlalchemy_uri,
            "libpq_uri": libpq_uri,
            "warehouse": f"file://{workdir / 'warehouse'}",
            "delta_root": str(workdir / "delta"),
            "files": args.files,
            "per_file": args.per_file,
            "partitions": args.partitions,
        }
        for engine in ("ours", "delta"):
            t0 = time.perf_counter()
            got = spawn(
                {"what": "prep", "engine": engine, "cfg": cfg}, f"prep-{engine}", workdir, 7200
            )
            data = got.pop("data", None)
            print(f"prep {engine}: {got} in {time.perf_counter() - t0:.0f} s", flush=True)
            if got.get("files") != args.files:
                print(f"prep {engine}: wrong file count, stopping", file=sys.stderr)
                return 1
            if data is not None:
                cfg["data"] = data
        res: dict[str, dict[str, Any]] = {}
        steps = [
            ("floor", "floor"),
            ("compact", "ours"),
            ("compact", "delta"),
            ("cleanup", "ours"),
            ("cleanup", "delta"),
        ]
        for what, engine in steps:
            payload = {"what": what, "engine": engine, "cfg": cfg}
            got = spawn(payload, f"{what}-{engine}", workdir, 3600)
            key = f"{what} {engine}"
            if "failure" in got:
                print(f"{key}: {got['failure']}")
                failed = True
                continue
            res[key] = got
            print(
                f"{key:<16} {fmt_s(got['seconds'])} s, peak {fmt_mb(got['peak_mb'])} MB "
                f"(+{fmt_mb(got['call_mb'])} over the call); {got['detail']}",
                flush=True,
            )
            check = got["detail"].get("check")
            if check is not None and not (check["rows"] == rows == check["ids"]):
                print(f"  CHECK FAILED: {check}, want {rows} rows and unique ids")
                failed = True
        print("\n== ratios (targets of issue 45) ==")

        def ratio(a: str, b: str, field: str = "seconds") -> float | None:
            if a not in res or b not in res:
                return None
            return float(res[a][field]) / float(res[b][field])

        def verdict(label: str, x: float | None, bound: float) -> None:
            if x is None:
                print(f"- {label}: -")
                return
            print(f"- {label} <= {bound}x: {x:.2f}x ({'meets' if x <= bound else 'MISSES'})")

        verdict("compaction, ours / delta-rs", ratio("compact ours", "compact delta"), 0.5)
        verdict("compaction, ours / floor", ratio("compact ours", "floor floor"), 1.5)
        verdict(
            "compaction peak RSS, ours / delta-rs",
            ratio("compact ours", "compact delta", "peak_mb"),
            1.0,
        )
        verdict("expiry + orphans, ours / vacuum", ratio("cleanup ours", "cleanup delta"), 0.5)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nload avg at end: {load}; wall time {time.perf_counter() - wall:.0f} s")
    finally:
        server.cleanup()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
