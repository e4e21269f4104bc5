"""Maintenance of a table of MANY small files, ours vs delta-rs and vs the floor (issue 45).

Run from the repository root:

    .venv/bin/python benchmarks/bench_small_files_maintenance.py               # 20,000 files of 50 rows
    .venv/bin/python benchmarks/bench_small_files_maintenance.py --files 2000  # a quick look
    .venv/bin/python benchmarks/bench_small_files_maintenance.py --partitions 200 --files 20000
    .venv/bin/python benchmarks/bench_small_files_maintenance.py --storage s3     # over S3

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
  rows once as one Parquet file — measured in the same run; with `--partitions P`, also vs
  "floor, partitioned": the same scan written once as one file per partition (`sink_parquet`
  to `pl.PartitionBy` on the partition column: P files, as the compaction must write them);
- expiry + orphans: ours `expire_snapshots(older_than=0, retain_last=1)` (every snapshot but the
  compaction's, and the files only they referenced: the F small files, the manifests and
  manifest lists) then `remove_orphans(grace_s=0)` vs delta-rs `vacuum(retention_hours=0)`
  (deletes the F files the compaction removed).

- the delete floor: plainly deleting F files of our data files' mean size, laid out as ours
  (one directory, or P; on S3 under ours' table's data/), made beforehand (not timed, synced)
  just before the cleanups: locally `os.remove` in 16 threads (what ours uses; on this ext4
  disk 20,000 unlinks took 0.45 s in the runs of 2026-12-06 08:44-08:59, ~1.3 s in another
  measurement that day, 4 to 16 threads alike), on S3 multi-object deletes of 1,000 keys, 16
  at a time (as ours). Expiry and vacuum both delete (at least) these
  F files: neither can go below this line.

`--storage s3`: the same against a SeaweedFS `weed mini` the benchmark starts (its data under the
work directory, stopped at the end): ours on its Iceberg REST catalog with the table's files on
its S3 (`pipeline_output_tests.seaweed`'s properties; ours deletes with one multi-object delete
per 1,000 keys), delta-rs's table on the same S3 in another bucket (`AWS_ENDPOINT_URL`,
`AWS_ALLOW_HTTP`, `AWS_S3_ALLOW_UNSAFE_RENAME=true`: one writer), its files built locally as above
and uploaded; the floor reads our S3 files and writes one file back to S3. Small files are
written 16 at a time (setup only).

Both tables are checked after compaction (F*R rows, unique ids) and after cleanup (only the
compacted files left). Ratios within this run. Targets (issue 45): compaction <= 0.5x delta-rs
and <= 1.5x the floor, peak RSS <= delta-rs's; expiry + orphans <= 0.5x vacuum.
Nothing outside `benchmarks/.work/small_maintenance/` (git-ignored) is touched.

`--only floor-floor,floor-partitioned,compact-ours --reps 5`: only those steps (delta-rs's table is
not built unless a `-delta` step is asked for), five times in turn, ours' table put back as
prepared between reps (its catalog pointer; delta-rs's log), each step's median printed and used
for the ratios (local storage only: the SQL catalog's pointer is rewound).

`--cleanup-rounds N [--ab ROOT]`: only the cleanups, N times (single runs of one tree spread
0.36-0.55 s): both tables built and compacted once, their files saved; each round restores them
(files copied in the order of the originals' inodes, synced; ours' catalog pointer put back) and
measures the delete floor, ours' cleanup and vacuum, printing the round's seconds and ratios,
then the medians. `--ab ROOT`: ours' cleanup also by the checkout at ROOT (a child with
`PYTHONPATH=ROOT`), on the same restored table in the same round, the two trees' order
alternating round to round (local storage only). Without `--cleanup-rounds`, `--ab ROOT` runs
ours' compaction by both trees each rep (`--only compact-ours --reps 4 --ab ROOT`), each on the
table put back as prepared, the order alternating rep to rep; the medians and each rep's ratio of
the two are printed (local storage only).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_iceberg_arm import NAMESPACE, _rows, fmt_mb, fmt_s, machine, start_postgres
from bench_spread import measure
from bench_spread import ours_store as ours_sql_store
from bench_spread import spawn as spawn_child

HERE = Path(__file__).resolve().parent
STEP_NAMES = (
    "floor-floor",
    "floor-partitioned",
    "compact-ours",
    "compact-delta",
    "delete-floor",
    "cleanup-ours",
    "cleanup-delta",
)
NAME = "small"
COMMIT_FILES = 1000
PUT_THREADS = 16  # writing the small files (setup, not timed)
LOCAL_DELETE_THREADS = 16  # the delete floor, local: as ours (`orphans.LOCAL_DELETE_THREADS`)
S3_DELETE_THREADS = 16  # the delete floor, S3: as ours (`orphans.S3_DELETE_THREADS`)
S3_DELETE_BATCH = 1000  # keys per multi-object delete: the API's maximum
DELTA_BUCKET = "delta"
FLOOR_BUCKET = "floor"


def on_s3(cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("s3"))


def ours_store(cfg: dict[str, Any]) -> Any:
    """Our store: the SQL catalog with local files, or SeaweedFS's REST catalog over S3."""
    if not on_s3(cfg):
        return ours_sql_store(cfg)
    from pyiceberg.catalog.rest import RestCatalog

    from pipeline_output import IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock

    catalog = RestCatalog("bench", **cfg["s3"]["catalog"])
    return IcebergStore(catalog, NAMESPACE, lock=AdvisoryLock(cfg["libpq_uri"]))


def s3_client(cfg: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    s3 = cfg["s3"]
    return boto3.client(
        "s3",
        endpoint_url=s3["endpoint"],
        aws_access_key_id=s3["key"],
        aws_secret_access_key=s3["secret"],
        region_name=s3["region"],
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=32),
    )


def delta_location(cfg: dict[str, Any]) -> tuple[str, dict[str, str] | None]:
    """delta-rs's table: its URI and storage options (None: a local path)."""
    if not on_s3(cfg):
        return str(Path(cfg["delta_root"]) / NAME), None
    s3 = cfg["s3"]
    return f"s3://{DELTA_BUCKET}/{NAME}", {
        "AWS_ENDPOINT_URL": s3["endpoint"],
        "AWS_ACCESS_KEY_ID": s3["key"],
        "AWS_SECRET_ACCESS_KEY": s3["secret"],
        "AWS_REGION": s3["region"],
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",  # one writer: no locking provider needed
    }


def polars_options(cfg: dict[str, Any]) -> dict[str, str] | None:
    if not on_s3(cfg):
        return None
    s3 = cfg["s3"]
    return {
        "aws_endpoint_url": s3["endpoint"],
        "aws_access_key_id": s3["key"],
        "aws_secret_access_key": s3["secret"],
        "aws_region": s3["region"],
        "aws_allow_http": "true",
    }


def s3_keys(cfg: dict[str, Any], bucket: str, prefix: str) -> list[str]:
    client = s3_client(cfg)
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return keys


def upload(cfg: dict[str, Any], folder: Path, bucket: str, prefix: str) -> int:
    """Every file under `folder` to `bucket/prefix/...`, `PUT_THREADS` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    client = s3_client(cfg)
    files = [f for f in folder.rglob("*") if f.is_file()]

    def put(f: Path) -> None:
        key = f"{prefix}/{f.relative_to(folder).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=f.read_bytes())

    with ThreadPoolExecutor(PUT_THREADS) as pool:
        list(pool.map(put, files))
    return len(files)


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
        uri, options = delta_location(cfg)
        if (
            options is not None
        ):  # built here, then put on S3 as it is (its log's paths are relative)
            upload(cfg, folder, DELTA_BUCKET, NAME)
            shutil.rmtree(folder)
        return {"files": len(DeltaTable(uri, storage_options=options).file_uris())}

    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from pipeline_output.stores.iceberg.snapshot.commit import CommitRequest, commit
    from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
    from pipeline_output.stores.iceberg.snapshot.manifests import FlatTransaction

    store = ours_store(cfg)
    store.tables.catalog.create_namespace_if_not_exists(NAMESPACE)
    spec = ours_spec(cfg)
    store.write(spec, _file_frame(order[0], per, parts))
    with ThreadPoolExecutor(PUT_THREADS) as pool:
        for start in range(1, files, COMMIT_FILES):
            table = store.load(NAME)
            tx = FlatTransaction(table)
            writer = DataFileWriter(tx.table_metadata, table.io, write_id=uuid.uuid4())

            def one(j: int, writer: Any = writer) -> list[Any]:
                return list(writer.write(_file_frame(j, per, parts)))

            ready = [f for got in pool.map(one, order[start : start + COMMIT_FILES]) for f in got]
            commit(CommitRequest(tx=tx, dataset=NAME, properties={}, ready=ready, blind_retry=True))
    table = store.load(NAME)
    live = [task.file for task in table.scan().plan_files()]
    if on_s3(cfg):
        data = sorted(f.file_path for f in live)
    else:  # local paths, not file:// URIs (polars' object-store layer costs ~40 µs a file)
        data = sorted(
            str(p) for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")
        )
    return {
        "files": len(live),
        "snapshots": len(table.metadata.snapshots),
        "data": data,
        "file_bytes": sum(f.file_size_in_bytes for f in live) // max(1, len(live)),
        "location": table.location(),
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

    uri, options = delta_location(cfg)
    table = DeltaTable(uri, storage_options=options)
    arrow_ids = table.to_pyarrow_dataset().to_table(columns=["id"])["id"]
    return {
        "rows": len(arrow_ids),
        "ids": pc.count_distinct(arrow_ids).as_py(),
        "files": len(table.file_uris()),
    }


def files_on_disk(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


def files_stored(cfg: dict[str, Any], location: str) -> int:
    """Files (objects) under a table's location, local or S3."""
    if location.startswith("s3://"):
        bucket, _, prefix = location.removeprefix("s3://").partition("/")
        return len(s3_keys(cfg, bucket, prefix.rstrip("/") + "/"))
    return files_on_disk(Path(location.removeprefix("file://")))


def delete_floor(cfg: dict[str, Any]) -> dict[str, Any]:
    """Plainly delete as many files as expiry and vacuum delete (module docstring); only the
    deletes are timed."""
    from concurrent.futures import ThreadPoolExecutor

    files, parts = cfg["files"], cfg["partitions"]
    body = b"\0" * int(cfg["file_bytes"])
    names = [(f"part={j % parts}/" if parts else "") + f"f-{j:06d}.parquet" for j in range(files)]
    if on_s3(cfg):
        client = s3_client(cfg)
        # under ours' table's data/ (its table bucket takes no key outside a table's data/ or
        # metadata/)
        bucket, _, prefix = cfg["location"].removeprefix("s3://").partition("/")
        prefix = f"{prefix.rstrip('/')}/data/delete-floor/"
        keys = [f"{prefix}{n}" for n in names]
        with ThreadPoolExecutor(PUT_THREADS) as pool:
            list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=body), keys))
        batches = [keys[i : i + S3_DELETE_BATCH] for i in range(0, len(keys), S3_DELETE_BATCH)]

        def delete_batch(batch: list[str]) -> None:
            client.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )

        def call() -> None:
            with ThreadPoolExecutor(S3_DELETE_THREADS) as pool:
                list(pool.map(delete_batch, batches))

        measured = measure(call)
        left = len(s3_keys(cfg, bucket, prefix))
        return {
            **measured,
            "detail": {
                "deleted": files,
                "left": left,
                "how": "S3 multi-object deletes of 1,000 keys, 16 threads",
            },
        }
    root = Path(cfg["delta_root"]).parent / "delete-floor"
    paths = [root / n for n in names]
    for d in {p.parent for p in paths}:
        d.mkdir(parents=True, exist_ok=True)
    for path in paths:
        path.write_bytes(body)
    os.sync()  # (ours' and delta-rs's files were written minutes before: on disk, not dirty)
    size = -(-len(paths) // (LOCAL_DELETE_THREADS * 2))
    batches = [paths[i : i + size] for i in range(0, len(paths), size)]

    def unlink_all(batch: list[Path]) -> None:
        for path in batch:
            os.remove(path)

    def call() -> None:
        with ThreadPoolExecutor(LOCAL_DELETE_THREADS) as pool:
            list(pool.map(unlink_all, batches))

    measured = measure(call)
    left = files_on_disk(root)
    shutil.rmtree(root)
    return {**measured, "detail": {"deleted": files, "left": left, "how": "os.remove, 16 threads"}}


def partitioned_floor(cfg: dict[str, Any]) -> dict[str, Any]:
    """The floor of a partitioned table's compaction: polars' native multi-file scan of every
    data file, written once as one file per partition (`sink_parquet` to `pl.PartitionBy` on
    the partition column: P files, as a compaction of P partitions writes)."""
    import polars as pl

    options = polars_options(cfg)
    out: Any = Path(cfg["delta_root"]).parent / "floor-partitioned"
    if options is not None:
        out = f"s3://{FLOOR_BUCKET}/floor-partitioned/"

    def floor() -> None:
        pl.scan_parquet(cfg["data"], storage_options=options).sink_parquet(
            pl.PartitionBy(out, key="part"), storage_options=options, mkdir=True
        )

    measured = measure(floor)
    if options is None:
        written = [str(p) for p in Path(out).rglob("*.parquet")]
    else:
        written = [f"s3://{FLOOR_BUCKET}/{k}" for k in s3_keys(cfg, FLOOR_BUCKET, "floor-part")]
    rows = pl.scan_parquet(written, storage_options=options).select(pl.len()).collect().item()
    if options is None:
        shutil.rmtree(out)
    else:
        client = s3_client(cfg)
        for key in s3_keys(cfg, FLOOR_BUCKET, "floor-part"):
            client.delete_object(Bucket=FLOOR_BUCKET, Key=key)
    return {**measured, "detail": {"rows": rows, "files": len(written)}}


def timed(cfg: dict[str, Any], what: str, engine: str) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    if what == "delete":
        return delete_floor(cfg)
    if what == "floor" and engine == "partitioned":
        return partitioned_floor(cfg)
    if what == "floor":
        import polars as pl

        data = cfg["data"]
        options = polars_options(cfg)
        out: Any = Path(cfg["delta_root"]).parent / "floor.parquet"
        if options is not None:
            out = f"s3://{FLOOR_BUCKET}/floor.parquet"

        def floor() -> None:
            pl.scan_parquet(data, storage_options=options).sink_parquet(
                out, storage_options=options
            )

        measured = measure(floor)
        detail["rows"] = (
            pl.scan_parquet(out, storage_options=options).select(pl.len()).collect().item()
        )
        if options is None:
            out.unlink()
        else:
            s3_client(cfg).delete_object(Bucket=FLOOR_BUCKET, Key="floor.parquet")
        return {**measured, "detail": detail}
    if engine == "ours":
        from datetime import timedelta

        from pipeline_output import IcebergStore  # noqa: F401  (imported before the timing)
        from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog  # noqa: F401

        if not on_s3(cfg):  # the SQL catalog's dialect, imported on its engine's first use
            import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

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
        detail["on disk"] = files_stored(cfg, ours_store(cfg).load(NAME).location())
    else:
        from deltalake import DeltaTable

        path, options = delta_location(cfg)

        def opened() -> Any:
            """The table, opened inside the timed call as ours is loaded inside it: opening
            replays the log (the 20,000 adds, the optimize's 20,000 removes)."""
            started = time.perf_counter()
            table = DeltaTable(path, storage_options=options)
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
        detail["on disk"] = files_stored(cfg, path)
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
    ap.add_argument("--storage", choices=("local", "s3"), default="local")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated steps to measure, of: " + ", ".join(STEP_NAMES) + " (default: all)",
    )
    ap.add_argument(
        "--reps",
        type=int,
        default=1,
        help="measure the steps this many times, in turn, and print each step's median (the "
        "tables are put back as prepared between reps; not with the cleanups)",
    )
    ap.add_argument(
        "--cleanup-rounds",
        type=int,
        default=0,
        metavar="N",
        help="only the cleanups: build and compact both tables once, then N rounds of the\n"
        "delete floor, ours' cleanup and vacuum, each on the compacted tables restored from a\n"
        "copy; each round's seconds and ratios, then the medians",
    )
    ap.add_argument(
        "--ab",
        default=None,
        metavar="ROOT",
        help="with --cleanup-rounds: also ours' cleanup by the checkout at ROOT (its\n"
        "pipeline_output), each round on the same restored table, the two trees' order alternated;\n"
        "else: also ours' compaction (compact-ours) by that checkout, each rep, on the table\n"
        "restored, the two trees' order alternated rep to rep",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    only = STEP_NAMES if args.only is None else tuple(args.only.split(","))
    unknown = sorted(set(only) - set(STEP_NAMES))
    if unknown or args.reps < 1:
        ap.error(f"--only: unknown step(s) {unknown}" if unknown else "--reps: at least 1")
    if args.reps > 1 and {"delete-floor", "cleanup-ours", "cleanup-delta"} & set(only):
        ap.error("--reps > 1 measures the compactions and floors only")
    cleanups = {"delete-floor", "cleanup-ours", "cleanup-delta"} & set(only)
    if args.ab and not args.cleanup_rounds and cleanups:  # (the tables are put back between)
        ap.error("--ab without --cleanup-rounds measures the compactions and floors only")
    if args.reps > 1 and args.storage == "s3":  # (the restore rewinds the SQL catalog's row)
        ap.error("--reps > 1 on the local SQL catalog only")
    if args.ab and args.storage == "s3":  # (the restore rewinds the SQL catalog's row)
        ap.error("--ab on the local SQL catalog only")
    if args.cleanup_rounds and args.storage == "s3":  # (the restore rewinds the catalog's row)
        ap.error("--cleanup-rounds on the local SQL catalog only")
    args.only = only
    workdir = HERE / ".work" / "small_maintenance"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    wall = time.perf_counter()
    server, sqlalchemy_uri, libpq_uri = start_postgres(workdir)
    rows = args.files * args.per_file
    failed = False
    try:
        with contextlib.ExitStack() as stack:
            s3: dict[str, Any] = {}
            if args.storage == "s3":
                from pipeline_output_tests.seaweed import running_seaweedfs

                sw = stack.enter_context(running_seaweedfs(workdir / "seaweed"))
                s3 = {
                    "endpoint": sw.s3_endpoint,
                    "key": sw.access_key_id,
                    "secret": sw.secret_access_key,
                    "region": sw.region,
                    "bucket": sw.bucket,
                    "catalog": sw.catalog_properties(),
                }
                for bucket in (DELTA_BUCKET, FLOOR_BUCKET):
                    sw.s3_client().create_bucket(Bucket=bucket)
            failed = run(args, workdir, wall, rows, s3, sqlalchemy_uri, libpq_uri)
    finally:
        server.cleanup()
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


@contextlib.contextmanager
def _pythonpath(root: str | None) -> Any:
    """A child spawned inside imports the checkout at `root`'s pipeline_output (None: as is)."""
    before = os.environ.get("PYTHONPATH")
    if root is not None:
        os.environ["PYTHONPATH"] = root
    try:
        yield
    finally:
        if root is not None:
            if before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = before


def _prepared(cfg: dict[str, Any]) -> dict[str, Any]:
    """What `_restore` puts back: ours' metadata pointer and delta-rs's log as prepared."""
    import psycopg

    with psycopg.connect(cfg["libpq_uri"]) as conn:
        row = conn.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_name = %s", (NAME,)
        ).fetchone()
    log = Path(delta_location(cfg)[0]) / "_delta_log"
    return {
        "metadata": row[0] if row else None,
        "log": {p.name for p in log.iterdir()} if log.is_dir() else None,
    }


def _restore(cfg: dict[str, Any], prepared: dict[str, Any]) -> None:
    """Both tables back as prepared (a compaction's written files stay on disk, unreferenced)."""
    import psycopg

    if prepared["metadata"] is not None:
        with psycopg.connect(cfg["libpq_uri"]) as conn:
            conn.execute(
                "UPDATE iceberg_tables SET metadata_location = %s WHERE table_name = %s",
                (prepared["metadata"], NAME),
            )
    if prepared["log"] is not None:
        log = Path(delta_location(cfg)[0]) / "_delta_log"
        for p in log.iterdir():
            if p.name not in prepared["log"]:
                p.unlink()


def run(
    args: argparse.Namespace,
    workdir: Path,
    wall: float,
    rows: int,
    s3: dict[str, Any],
    sqlalchemy_uri: str,
    libpq_uri: str,
) -> bool:
    """Every step, printed; True when one failed."""
    failed = False
    print("== pipeline-output benchmark: maintenance of a table of small files ==")
    for ln in machine(libpq_uri):
        print(ln)
    layout = f"{args.partitions} partitions" if args.partitions else "unpartitioned"
    where = (
        "ours on SeaweedFS's REST catalog + S3, delta-rs on its S3"
        if s3
        else "local disk, ours on the SQL catalog"
    )
    print(
        f"table:    {args.files:,} files of {args.per_file} rows ({rows:,} rows), {layout}; "
        f"each measurement a fresh process\nstorage:  {where}\n",
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
        "s3": s3,
    }
    needs_delta = bool(args.cleanup_rounds) or any(step.endswith("-delta") for step in args.only)
    for engine in ("ours", "delta") if needs_delta else ("ours",):
        t0 = time.perf_counter()
        got = spawn({"what": "prep", "engine": engine, "cfg": cfg}, f"prep-{engine}", workdir, 7200)
        if "failure" in got:
            print(f"prep {engine}: {got['failure']}", file=sys.stderr)
            return True
        data = got.pop("data", None)
        for key in ("file_bytes", "location"):
            if key in got:
                cfg[key] = got.pop(key)
        print(f"prep {engine}: {got} in {time.perf_counter() - t0:.0f} s", flush=True)
        if got.get("files") != args.files:
            print(f"prep {engine}: wrong file count, stopping", file=sys.stderr)
            return True
        if data is not None:
            cfg["data"] = data
    if args.cleanup_rounds:
        return cleanup_rounds(args, cfg, workdir, libpq_uri)
    res: dict[str, dict[str, Any]] = {}
    steps = [
        ("floor", "floor"),
        ("floor", "partitioned"),  # a partitioned table only
        ("compact", "ours"),
        ("compact", "delta"),
        ("delete", "floor"),  # just before the cleanups: the server as busy as for them
        ("cleanup", "ours"),
        ("cleanup", "delta"),
    ]
    steps = [
        (what, engine)
        for what, engine in steps
        if f"{what}-{engine}" in args.only and (engine != "partitioned" or args.partitions)
    ]
    prepared = _prepared(cfg) if args.reps > 1 or args.ab else None
    runs: dict[str, list[dict[str, Any]]] = {}
    ran = False  # a step has changed the tables since they were (last) put back
    for rep in range(args.reps):
        plan: list[tuple[str, str, str | None]] = []
        for what, engine in steps:
            if (what, engine) == ("compact", "ours") and args.ab:  # both trees, order alternated
                sides: list[str | None] = [None, args.ab]
                plan += [(what, engine, root) for root in (sides if rep % 2 == 0 else sides[::-1])]
            else:
                plan.append((what, engine, None))
        for what, engine, root in plan:
            if ran and prepared is not None and what == "compact":
                _restore(cfg, prepared)
            ran = ran or what == "compact"
            payload = {"what": what, "engine": engine, "cfg": cfg}
            with _pythonpath(root):
                got = spawn(payload, f"{what}-{engine}", workdir, 3600)
            key = f"{what} {engine}" if root is None else f"{what} {engine}@ab"
            if "failure" in got:
                print(f"{key}: {got['failure']}")
                failed = True
                continue
            runs.setdefault(key, []).append(got)
            print(
                f"{key:<16} {fmt_s(got['seconds'])} s, peak {fmt_mb(got['peak_mb'])} MB "
                f"(+{fmt_mb(got['call_mb'])} over the call); {got['detail']}",
                flush=True,
            )
            if what == "delete" and got["detail"]["left"]:
                print(f"  DELETE FLOOR LEFT {got['detail']['left']} file(s)")
                failed = True
            check = got["detail"].get("check")
            if check is not None and not (check["rows"] == rows == check["ids"]):
                print(f"  CHECK FAILED: {check}, want {rows} rows and unique ids")
                failed = True
    for key, got_all in runs.items():
        res[key] = {
            field: statistics.median(g[field] for g in got_all) for field in ("seconds", "peak_mb")
        }
        if args.reps > 1:
            seconds = ", ".join(fmt_s(g["seconds"]) for g in got_all)
            peaks = ", ".join(fmt_mb(g["peak_mb"]) for g in got_all)
            print(
                f"median {key:<17} {fmt_s(res[key]['seconds'])} s ({seconds}), peak "
                f"{fmt_mb(res[key]['peak_mb'])} MB ({peaks})"
            )
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
    x = ratio("compact ours", "floor partitioned")
    if x is not None:
        print(f"  (compaction ours / the floor, partitioned ({args.partitions} files): {x:.2f}x)")
    if "compact ours@ab" in res:
        ab = f"ours@{args.ab}"
        for floor in ("floor floor", "floor partitioned"):
            x = ratio("compact ours@ab", floor)
            if x is not None:
                print(f"  (compaction {ab} / {floor}: {x:.2f}x)")
        pairs = [
            a["seconds"] / b["seconds"]
            for a, b in zip(runs["compact ours"], runs["compact ours@ab"], strict=False)
        ]
        print(
            f"  (compaction ours / {ab}: {ratio('compact ours', 'compact ours@ab'):.2f}x; each "
            f"rep's: {', '.join(f'{x:.2f}' for x in pairs)})"
        )
    verdict(
        "compaction peak RSS, ours / delta-rs",
        ratio("compact ours", "compact delta", "peak_mb"),
        1.0,
    )
    verdict("expiry + orphans, ours / vacuum", ratio("cleanup ours", "cleanup delta"), 0.5)
    for label, key in (("ours", "cleanup ours"), ("delta-rs vacuum", "cleanup delta")):
        x = ratio(key, "delete floor")
        if x is not None:
            print(f"  (expiry + orphans {label} / the delete floor: {x:.2f}x)")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload avg at end: {load}; wall time {time.perf_counter() - wall:.0f} s")
    return failed


def _copy_in_inode_order(source: Path, target: Path) -> None:
    """`source`'s tree copied to `target` file by file in the order of the source files'
    inodes (about the order they were written in), so the copies' inodes keep that order (a
    delete in a shuffled inode order is ~15 % slower on this disk; benchmarks/results/small-files-maintenance.md)."""
    files = sorted((p for p in source.rglob("*") if p.is_file()), key=lambda p: p.stat().st_ino)
    for path in files:
        out = target / path.relative_to(source)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, out)


def cleanup_rounds(
    args: argparse.Namespace, cfg: dict[str, Any], workdir: Path, libpq_uri: str
) -> bool:
    """`--cleanup-rounds N`: both tables compacted once (printed, not ratios), saved, then
    N rounds, each on the saved tables restored (files copied in inode order and
    synced, ours' catalog pointer put back): the delete floor, ours' cleanup (and, with `--ab`,
    the other checkout's, the two in alternating order, the table restored between), vacuum.
    Each round's seconds and ratios, then the medians. True when a step failed."""
    import statistics

    import psycopg

    failed = False
    for engine in ("ours", "delta"):
        got = spawn(
            {"what": "compact", "engine": engine, "cfg": cfg}, f"compact-{engine}", workdir, 3600
        )
        if "failure" in got:
            print(f"compact {engine}: {got['failure']}")
            return True
        print(f"compact {engine:<8} {fmt_s(got['seconds'])} s; {got['detail']}", flush=True)
    live = {
        "ours": Path(cfg["warehouse"].removeprefix("file://")),
        "delta": Path(cfg["delta_root"]),
    }
    saved = workdir / "saved"
    for name, folder in live.items():
        _copy_in_inode_order(folder, saved / name)
    pointer = "SELECT metadata_location, previous_metadata_location FROM iceberg_tables"
    with psycopg.connect(libpq_uri, autocommit=True) as conn:
        catalog = conn.execute(pointer + " WHERE table_name = %s", (NAME,)).fetchone()

    def restore() -> None:
        for name, folder in live.items():
            shutil.rmtree(folder)
            _copy_in_inode_order(saved / name, folder)
        with psycopg.connect(libpq_uri, autocommit=True) as conn:
            conn.execute(
                "UPDATE iceberg_tables SET metadata_location = %s, previous_metadata_location = %s"
                " WHERE table_name = %s",
                (*catalog, NAME),
            )
        os.sync()

    def one(what: str, engine: str, tag: str, root: str | None = None) -> float | None:
        nonlocal failed
        with _pythonpath(root):  # the child imports that checkout's pipeline_output
            got = spawn({"what": what, "engine": engine, "cfg": cfg}, tag, workdir, 3600)
        if "failure" in got:
            print(f"  {tag}: {got['failure']}")
            failed = True
            return None
        check = got["detail"].get("check")
        if check is not None and not (
            check["rows"] == check["ids"] == cfg["files"] * cfg["per_file"]
        ):
            print(f"  {tag}: CHECK FAILED: {check}")
            failed = True
        if what == "delete" and got["detail"]["left"]:
            print(f"  {tag}: DELETE FLOOR LEFT {got['detail']['left']} file(s)")
            failed = True
        return float(got["seconds"])

    sides = ["ours", *(["ab"] if args.ab else [])]
    times: dict[str, list[float]] = {k: [] for k in ("floor", *sides, "vacuum")}
    label = {"ours": "ours", "ab": f"ours@{args.ab}"}
    print(f"\n== cleanup, {args.cleanup_rounds} round(s) on restored copies ==", flush=True)
    for rep in range(args.cleanup_rounds):
        restore()
        got: dict[str, float | None] = {"floor": one("delete", "floor", f"floor-{rep}")}
        for n, side in enumerate(sides if rep % 2 == 0 else sides[::-1]):
            if n:
                restore()
            root = args.ab if side == "ab" else None
            got[side] = one("cleanup", "ours", f"cleanup-{side}-{rep}", root)
        got["vacuum"] = one("cleanup", "delta", f"vacuum-{rep}")
        for key, value in got.items():
            if value is not None:
                times[key].append(value)
        shown = ", ".join(f"{label.get(k, k)} {v:.3f} s" for k, v in got.items() if v is not None)
        ratios = ", ".join(
            f"{label[s]} / vacuum {got[s] / got['vacuum']:.2f}x, / floor {got[s] / got['floor']:.2f}x"  # type: ignore[operator]
            for s in sides
            if got[s] and got["vacuum"] and got["floor"]
        )
        print(f"round {rep}: {shown}; {ratios}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print("\n== medians ==")
    print(", ".join(f"{label.get(k, k)} {v:.3f} s" for k, v in med.items()))
    for side in sides:
        if side in med and "vacuum" in med and "floor" in med:
            print(
                f"- expiry + orphans, {label[side]} / vacuum <= 0.5x: {med[side] / med['vacuum']:.2f}x "
                f"(median of the rounds' ratios "
                f"{statistics.median(a / b for a, b in zip(times[side], times['vacuum'], strict=False)):.2f}x);"
                f" / the delete floor {med[side] / med['floor']:.2f}x"
            )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load avg at end: {load}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
