"""Small writes through Dagster, against dagster-deltalake and dagster-iceberg (issue 44).

Run from the repository root (each measurement is a fresh process; engines are interleaved):

    flock /tmp/bench.lock python3 benchmarks/bench_small_writes.py                 # 90 x 100k
    flock /tmp/bench.lock python3 benchmarks/bench_small_writes.py --partitions 20 --rows 100000

A daily-partitioned table (`id` int64 key, `day` date partition column, three value columns),
`--rows` rows per day, written as a user runs it: in-process `execute_in_process` of the asset's
job on an ephemeral instance, one fresh Python process per measurement. Workloads:

- `runs`: one run per partition (`--partitions` runs, in one process, timed together);
- `backfill`: one single-run backfill of every partition (a range run) into a new table;
- `one`: re-materialise one partition of the first backfill's table (written first, untimed,
  when `backfill` is not among the workloads: `--only one` measures the same write);
- `read7` / `readall`: a downstream asset partitioned the same way, run over 7 partitions
  (across a month boundary) / all of them, collecting what it was given; the row count is
  checked against what the upstream wrote (a peer returning other rows is reported `WRONG`).

Engines: `ours` (`@dataset(strategy="replace", mode="iceberg")`, SQL catalog on an embedded
Postgres), `deltalake` (dagster-deltalake-polars, `mode=overwrite`, `partition_expr="day"`),
`iceberg` (dagster-iceberg's polars IO manager on a SQLite SQL catalog, `partition_expr="day"`),
and `noop` — the same harness whose asset returns the partition's frame to an IO manager that
writes nothing (a range run computes its partitions one at a time, as `ours` does): the
**marginal cost** of an engine is its time minus `noop`'s. Each of `runs`, `backfill` and `one`
is measured `--reps` times (default 3), the engines interleaved within a rep, each rep's `runs`
and `backfill` into new tables; the report gives medians, and the median of each rep's paired
ratio (ours' marginal over dagster-deltalake's, both against that rep's `noop`). The peers each run in their own virtualenv, created on demand
under /work/venvs/ (`--system-site-packages`, dagster pinned to the installed version): dagster-
iceberg 0.3.14 needs pyiceberg < 0.12, which cannot live beside this project's pyiceberg.

The floor of a write: its partitions' bytes at this machine's measured Parquet encode rate
(pyarrow, zstd, the frame encoded once) plus one commit (a pyiceberg append on the same SQL
catalog, measured).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

VENVS = Path("/work/venvs")
START = date(2024, 1, 1)
ENGINES = ("noop", "ours", "deltalake", "iceberg")
PEER_PACKAGES = {
    "deltalake": ["dagster-deltalake=={plugin}", "dagster-deltalake-polars=={plugin}"],
    "iceberg": ["pyiceberg[sql-sqlite,pyarrow]<0.12", "dagster-iceberg[polars]==0.3.14"],
}


# -- the harness every engine shares (runs inside the measured process) ----------------------


def frame_for(key: str, rows: int):  # type: ignore[no-untyped-def]
    """Partition `key`'s rows: the same in every engine (generated, not read)."""
    import polars as pl

    day = date.fromisoformat(key)
    n = (day - START).days
    ids = pl.int_range(n * rows, (n + 1) * rows, dtype=pl.Int64, eager=True)
    return pl.DataFrame({"id": ids}).with_columns(
        day=pl.lit(day, dtype=pl.Date),
        amount=(pl.col("id") * 7 % 1000).cast(pl.Float64) / 10,
        qty=(pl.col("id") % 17).cast(pl.Int32),
        label=pl.format("item-{}", pl.col("id") % 5000),
    )


def days(n: int) -> list[str]:
    return [(START + timedelta(days=i)).isoformat() for i in range(n)]


def worker(args: argparse.Namespace) -> dict[str, object]:
    """One measurement, in this fresh process: returns seconds and what it checked."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    import dagster as dg

    logging.getLogger("dagster").setLevel(logging.ERROR)
    keys = days(args.partitions)
    daily = dg.DailyPartitionsDefinition(
        start_date=keys[0], end_date=(START + timedelta(days=args.partitions)).isoformat()
    )
    table = f"{args.workload_table}_{args.engine}"
    defs, up_key = _definitions(args, daily, table)
    job = defs.resolve_implicit_global_asset_job_def()
    work = args.workload
    if work in ("runs", "fill"):
        batches = [[k] for k in keys]
    elif work == "backfill":
        batches = [keys]
    elif work == "one":
        batches = [[keys[len(keys) // 2]]]
    elif work == "read7":
        # 7 days across a month boundary (the last 7 when the table is shorter than that)
        mid = next((i for i, k in enumerate(keys) if k.endswith("-01") and i >= 3), len(keys) - 4)
        batches = [keys[max(0, mid - 3) : mid + 4]]
    else:  # readall
        batches = [keys]
    selection = [up_key] if not work.startswith("read") else [dg.AssetKey(f"{table}_down")]
    checked: dict[str, object] = {}
    with dg.DagsterInstance.ephemeral() as instance:
        started = time.perf_counter()
        for batch in batches:
            tags = (
                {
                    "dagster/asset_partition_range_start": batch[0],
                    "dagster/asset_partition_range_end": batch[-1],
                }
                if len(batch) > 1
                else {}
            )
            out = job.execute_in_process(
                instance=instance,
                asset_selection=selection,
                partition_key=batch[0] if len(batch) == 1 else None,
                tags=tags,
                raise_on_error=False,
            )
            if not out.success:
                failure = next(
                    (e for e in out.all_events if e.event_type_value == "STEP_FAILURE"), None
                )
                err = failure.event_specific_data.error if failure else None
                while err is not None and err.cause is not None:  # the root cause
                    err = err.cause
                why = err.message if err is not None else "failed"
                return {"error": why.strip().splitlines()[0][:160]}
            if work.startswith("read"):
                mats = out.asset_materializations_for_node(f"{table}_down")
                got = int(mats[-1].metadata["rows"].value) if mats else -1
                checked = {"rows": got, "expected": len(batch) * args.rows}
        elapsed = time.perf_counter() - started
    return {"seconds": elapsed, **checked}


def _definitions(args: argparse.Namespace, daily, table: str):  # type: ignore[no-untyped-def]
    import dagster as dg
    import polars as pl

    rows = args.rows
    meta = {"partition_expr": "day"}

    def produce(context: dg.AssetExecutionContext) -> pl.DataFrame:
        keys = sorted(context.partition_keys)
        return (
            pl.concat([frame_for(k, rows) for k in keys])
            if len(keys) > 1
            else frame_for(keys[0], rows)
        )

    def downstream(up_key: dg.AssetKey, kind: type) -> dg.AssetsDefinition:
        @dg.asset(
            name=f"{table}_down",
            partitions_def=daily,
            ins={"up": dg.AssetIn(key=up_key)},
        )
        def down(up: kind) -> dg.MaterializeResult:  # type: ignore[valid-type]
            frame = up.collect() if isinstance(up, pl.LazyFrame) else up
            if isinstance(frame, dict):  # a per-partition mapping
                frame = pl.concat(
                    [f.collect() if isinstance(f, pl.LazyFrame) else f for f in frame.values()]
                )
            return dg.MaterializeResult(metadata={"rows": int(frame.height)})

        return down

    if args.engine == "ours":
        from pipeline_output import build_definitions, dataset

        @dataset(
            table,
            primary_key="id",
            strategy="replace",
            mode="iceberg",
            partitions_def=daily,
            partition_column="day",
        )
        def ours(partition_key: str) -> pl.DataFrame:
            return frame_for(partition_key, rows)

        key = dg.AssetKey(table)
        return build_definitions(
            datasets=[ours], assets=[downstream(key, pl.LazyFrame)], with_maintenance=False
        ), key

    if args.engine == "noop":

        class Discard(dg.IOManager):
            def handle_output(self, context: dg.OutputContext, obj: object) -> None:
                return None

            def load_input(self, context: dg.InputContext) -> object:
                keys = context.asset_partition_keys
                return pl.concat([frame_for(k, rows) for k in keys])

        @dg.asset(name=table, partitions_def=daily)
        def noop(context: dg.AssetExecutionContext) -> pl.DataFrame | None:
            # "a no-op asset that returns the same frame without writing" (issue 44): one
            # partition's run returns its frame, handed to an IO manager that discards it, as
            # every engine's run hands its frame to its IO manager; a range run computes its
            # partitions one frame at a time, as `ours` does, and returns nothing (not the
            # concatenated frame the peers' asset builds, which would charge the harness
            # a concatenation ours does not make)
            keys = sorted(context.partition_keys)
            if len(keys) == 1:
                return frame_for(keys[0], rows)
            for k in keys:
                frame_for(k, rows)
            return None

        key = dg.AssetKey(table)
        down = downstream(key, pl.DataFrame)
        return dg.Definitions(
            assets=[noop, down],
            resources={"io_manager": dg.IOManagerDefinition.hardcoded_io_manager(Discard())},
        ), key

    if args.engine == "deltalake":
        from dagster_deltalake import LocalConfig
        from dagster_deltalake_polars import DeltaLakePolarsIOManager

        io = DeltaLakePolarsIOManager(
            root_uri=str(Path(args.dir) / "delta"), storage_options=LocalConfig(), mode="overwrite"
        )
    else:  # dagster-iceberg
        from dagster_iceberg.config import IcebergCatalogConfig
        from dagster_iceberg.io_manager.polars import PolarsIcebergIOManager

        io = PolarsIcebergIOManager(
            name="bench",
            config=IcebergCatalogConfig(properties=_iceberg_peer_catalog(args.dir)),
            namespace="bench",
        )
    asset = dg.asset(name=table, key_prefix=["bench"], partitions_def=daily, metadata=meta)(produce)
    key = dg.AssetKey(["bench", table])
    return dg.Definitions(
        assets=[asset, downstream(key, pl.DataFrame)], resources={"io_manager": io}
    ), key


def _iceberg_peer_catalog(root: str) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"sqlite:///{root}/iceberg-peer.db",
        "warehouse": f"file://{root}/iceberg-peer",
    }


# -- the orchestrator --------------------------------------------------------------------------


def python_for(engine: str) -> str:
    if engine in ("ours", "noop"):
        return sys.executable
    venv = VENVS / f"dagster-{engine}"
    py = venv / "bin" / "python"
    if not py.exists():
        import dagster

        plugin = _plugin_version(dagster.__version__)
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True
        )
        pkgs = [p.format(plugin=plugin) for p in PEER_PACKAGES[engine]]
        env = {**os.environ, "PIP_CONSTRAINT": ""}
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", f"dagster=={dagster.__version__}", *pkgs],
            check=True,
            env=env,
        )
    return str(py)


def _plugin_version(core: str) -> str:
    """A dagster integration's version for a dagster core version: 1.13.27 -> 0.29.27."""
    major, minor, patch = (int(x) for x in core.split(".")[:3])
    return f"0.{minor + 16}.{patch}" if major == 1 else core


def measure(
    args: argparse.Namespace, engine: str, workload: str, env: dict[str, str], *, rep: int = 0
) -> dict[str, object]:
    """One measurement in a fresh process. `backfill` and `runs` write a new table each rep
    (`bf`, `bf1`, ...): every rep measures the same work, the first write of those partitions;
    `one` and the reads use the first backfill's table."""
    table = "bf" if workload in ("backfill", "fill", "one", "read7", "readall") else workload
    if workload in ("backfill", "runs") and rep:
        table += str(rep)
    cmd = [
        python_for(engine),
        __file__,
        "--worker",
        "--engine",
        engine,
        "--workload",
        workload,
        "--workload-table",
        table,
        "--partitions",
        str(args.partitions),
        "--rows",
        str(args.rows),
        "--dir",
        args.dir,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:160]}"}
    return json.loads(lines[-1][len("RESULT ") :])


def floor_seconds(args: argparse.Namespace, n: int) -> tuple[float, float]:
    """(encode seconds per partition at zstd, one commit's seconds)."""
    import io

    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog

    arrow = frame_for(START.isoformat(), args.rows).to_arrow()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        pq.write_table(arrow, io.BytesIO(), compression="zstd")
        times.append(time.perf_counter() - t)
    encode = statistics.median(times)
    cat = SqlCatalog(
        "floor",
        uri=f"sqlite:///{args.dir}/floor.db",
        warehouse=f"file://{args.dir}/floor",
    )
    cat.create_namespace("f")
    tiny = arrow.slice(0, 1)
    tbl = cat.create_table("f.t", schema=tiny.schema)
    tbl.append(tiny)
    commits = []
    for _ in range(3):
        t = time.perf_counter()
        tbl.append(tiny)
        commits.append(time.perf_counter() - t)
    return encode, statistics.median(commits)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--partitions", type=int, default=90)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument(
        "--reps",
        type=int,
        default=3,
        help="measurements of each workload, engines interleaved within a rep (medians, and the "
        "median of each rep's paired ratio)",
    )
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--only", default="runs,backfill,one,read7,readall")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--workload-table", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0

    from pipeline_output.infra import embedded_pg

    engines = [e for e in args.engines.split(",") if e]
    work = [w for w in args.only.split(",") if w]
    root = Path(tempfile.mkdtemp(prefix="bench-small-writes-"))
    args.dir = str(root)
    for e in engines:
        python_for(e)  # create the peers' virtualenvs before timing anything
    url = embedded_pg.start(data_dir=root / "pg")
    env = {
        **os.environ,
        "PIPELINE_OUTPUT_PG_URL": url,
        "PIPELINE_OUTPUT_HOME": str(root / "home"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parents[1])),
    }
    env.pop("PIPELINE_OUTPUT_FAULT", None)
    try:
        import sqlite3

        sqlite3.connect(root / "iceberg-peer.db").close()
        if "iceberg" in engines:  # dagster-iceberg does not create its namespace
            subprocess.run(
                [
                    python_for("iceberg"),
                    "-c",
                    "import sys,json; from pyiceberg.catalog.sql import SqlCatalog; "
                    "SqlCatalog('bench', **json.loads(sys.argv[1])).create_namespace('bench')",
                    json.dumps(
                        {k: v for k, v in _iceberg_peer_catalog(str(root)).items() if k != "type"}
                    ),
                ],
                check=True,
            )
        n, rows = args.partitions, args.rows
        print(
            f"small writes: {n} daily partitions x {rows:,} rows; engines {', '.join(engines)}; "
            f"python {sys.version.split()[0]}; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        results: dict[tuple[str, str], dict[str, object]] = {}
        paired: dict[str, list[float]] = {}  # per rep: ours' marginal / dagster-deltalake's
        order = [w for w in ("backfill", "one", "read7", "readall", "runs") if w in work]
        if "backfill" not in order and any(w in order for w in ("one", "read7", "readall")):
            # `one` and the reads use the first backfill's table (every partition): written
            # here, untimed, when the backfill is not measured (else `one` would rewrite the one
            # partition of a table its own first rep created, a lighter write than the workload's)
            for e in engines:
                filled = measure(args, e, "backfill", env)
                if "seconds" not in filled:
                    measure(args, e, "fill", env)
        for w in order:
            reps = args.reps if w in ("backfill", "one", "runs") else 1
            samples: dict[str, list[dict[str, object]]] = {e: [] for e in engines}
            for rep in range(reps):
                for e in engines:  # interleaved
                    samples[e].append(measure(args, e, w, env, rep=rep))
                    if w == "backfill" and rep == 0 and "seconds" not in samples[e][-1]:
                        # a peer that cannot backfill: its table is filled one run per partition
                        # (untimed) so that the workloads after it read and rewrite the same table
                        measure(args, e, "fill", env)
                one = {
                    e: samples[e][-1].get("seconds") if e in samples else None
                    for e in ("noop", "ours", "deltalake")
                }
                if all(isinstance(v, float) for v in one.values()):
                    base = float(one["noop"])  # type: ignore[arg-type]
                    dl = float(one["deltalake"]) - base  # type: ignore[arg-type]
                    if dl > 0:
                        paired.setdefault(w, []).append((float(one["ours"]) - base) / dl)  # type: ignore[arg-type]
            for e in engines:
                ok = [s for s in samples[e] if "seconds" in s]
                if ok:
                    secs = statistics.median(float(s["seconds"]) for s in ok)  # type: ignore[arg-type]
                    results[(e, w)] = {**ok[-1], "seconds": secs}
                else:
                    results[(e, w)] = samples[e][-1]
                r = results[(e, w)]
                print(f"  {w:9s} {e:10s} {_fmt(r)}", flush=True)
        encode, commit = floor_seconds(args, n)
        report(results, engines, order, n=n, encode=encode, commit=commit, paired=paired)
    finally:
        embedded_pg.stop(data_dir=root / "pg")
    return 0


def _fmt(r: dict[str, object]) -> str:
    if "seconds" not in r:
        return f"cannot: {r.get('error')}"
    out = f"{float(r['seconds']):8.3f} s"  # type: ignore[arg-type]
    if "rows" in r:
        right = r["rows"] == r["expected"]
        out += f"  rows {r['rows']:,} of {r['expected']:,}" + ("" if right else "  WRONG")  # type: ignore[str-format]
    return out


def report(results, engines, order, *, n: int, encode: float, commit: float, paired) -> None:  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ratios import interval_text

    floors = {
        "runs": n * (encode + commit),
        "backfill": n * encode + commit,
        "one": encode + commit,
    }
    print(f"\nfloor: Parquet encode {encode:.3f} s per partition (zstd), one commit {commit:.3f} s")
    print(f"{'workload':10s} " + " ".join(f"{e:>22s}" for e in engines) + f" {'floor':>8s}")

    def secs(e: str, w: str) -> float | None:
        r = results.get((e, w), {})
        return float(r["seconds"]) if "seconds" in r else None  # type: ignore[arg-type]

    def right(e: str, w: str) -> float | None:  # a peer that returned other rows did not complete
        r = results.get((e, w), {})
        return secs(e, w) if r.get("rows") == r.get("expected") else None

    for w in order:
        cells = []
        for e in engines:
            s = secs(e, w)
            base = secs("noop", w)
            if s is None:
                cells.append(f"{'cannot':>22s}")
            elif e == "noop" or base is None:
                cells.append(f"{s:>20.2f} s")
            else:
                cells.append(f"{s:8.2f} s (+{s - base:6.2f})")
        fl = floors.get(w)
        print(f"{w:10s} " + " ".join(cells) + (f" {fl:>6.2f} s" if fl else ""))
    print("\nratios (ours vs dagster-deltalake; marginal = run minus noop):")
    for w in order:
        ours, dl, base = secs("ours", w), secs("deltalake", w), secs("noop", w)
        if ours is None or base is None:
            continue
        m = ours - base
        line = f"  {w:9s} marginal ours {m:.3f} s"
        if dl is not None:
            md = dl - base
            line += f", deltalake {md:.3f} s: {m / md if md > 0 else float('inf'):.2f}x"
        peers = [s for s in (right("deltalake", w), right("iceberg", w)) if s is not None]
        if peers:
            line += f"; total ours / best peer {ours / min(peers):.2f}x"
        if w in floors and w != "runs":
            line += f"; marginal / floor {m / floors[w]:.1f}x"
        print(line)
        if len(paired.get(w, [])) > 1:
            each = ", ".join(f"{r:.2f}" for r in paired[w])
            print(f"  {'':9s} paired by rep: {each}; {interval_text(paired[w])}")


if __name__ == "__main__":
    raise SystemExit(main())
