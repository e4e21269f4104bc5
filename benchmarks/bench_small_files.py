"""An upsert into a table of MANY small files, ours vs delta-rs (issue 36): time and peak RSS.

Run from the repository root:

    .venv/bin/python benchmarks/bench_small_files.py              # 20,000 files of 50 rows, 3 reps
    .venv/bin/python benchmarks/bench_small_files.py --files 2000 --reps 1    # a quick look

The table: F data files of R rows each (file j holds the ids [j*R, (j+1)*R), the 6 columns of
`bench_iceberg_arm._rows`), unpartitioned — what years of small appends leave behind. Ours is
built from data files written with the project's `DataFileWriter` and committed 1,000 at a time
(fast appends: F/1000 manifests of 1,000 entries, the layout small appends leave once merged);
delta-rs's from the same Parquet files converted in place (`convert_to_deltalake`, one commit).
The upsert: 1,000 keys, 500 existing ids drawn uniformly over the table (each in another small
file, ~490 files touched) with changed values and 500 new ids, shuffled. Ours is
`IcebergStore.write` (strategy `snapshot_replace`); delta-rs is
`merge(...).when_matched_update_all().when_not_matched_insert_all()`.

As in `bench_spread.py`: tables built before anything is timed, one per engine and repetition;
every timed upsert in its own fresh process, engines interleaved; only the call is timed; peak
RSS is the process's VmHWM (interpreter, imports and batch included; `+N` is the growth over the
call). Medians of the repetitions, ratios within this run. The first repetition checks the
table afterwards: F*R + 500 rows, unique ids. Targets (issue 36): ours / delta-rs <= 0.5x in
time and in peak RSS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_iceberg_arm import _rows, fmt_mb, fmt_s, machine, start_postgres
from bench_spread import delta_upsert, id_counts, measure, ours_store, ours_upsert
from bench_spread import spawn as spawn_child

HERE = Path(__file__).resolve().parent
ENGINES = ("ours", "delta")
COMMIT_FILES = 1000


def _file_frame(j: int, per: int) -> Any:
    import polars as pl

    return _rows(pl.int_range(j * per, (j + 1) * per, eager=True), changed=False)


def prep(cfg: dict[str, Any], engine: str, rep: int) -> dict[str, Any]:
    """One table of `files` small files for `engine` (not timed)."""
    files, per = cfg["files"], cfg["per_file"]
    name = f"small_r{rep}"
    if engine == "delta":
        from deltalake import DeltaTable, convert_to_deltalake

        folder = Path(cfg["delta_root"]) / name
        folder.mkdir(parents=True)
        for j in range(files):
            _file_frame(j, per).write_parquet(folder / f"part-{j:06d}.parquet")
        convert_to_deltalake(str(folder))
        return {"files": len(DeltaTable(str(folder)).file_uris())}

    import uuid

    from pipeline_output import DatasetSpec
    from pipeline_output.stores.iceberg.snapshot.commit import CommitRequest, commit
    from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
    from pipeline_output.stores.iceberg.snapshot.manifests import FlatTransaction

    store = ours_store(cfg)
    spec = DatasetSpec(name=name, primary_key=("id",), strategy="append_always")
    store.write(spec, _file_frame(0, per))
    for start in range(1, files, COMMIT_FILES):
        table = store.load(name)
        tx = FlatTransaction(table)
        writer = DataFileWriter(tx.table_metadata, table.io, write_id=uuid.uuid4())
        ready = []
        for j in range(start, min(start + COMMIT_FILES, files)):
            ready.extend(writer.write(_file_frame(j, per)))
        commit(CommitRequest(tx=tx, dataset=name, properties={}, ready=ready, blind_retry=True))
    return {"files": len(list(store.load(name).scan().plan_files()))}


def timed(cfg: dict[str, Any], engine: str, rep: int) -> dict[str, Any]:
    name = f"small_r{rep}"
    detail: dict[str, Any] = {}
    if engine == "ours":
        from pipeline_output import DatasetSpec

        store = ours_store(cfg)
        spec = DatasetSpec(name=name, primary_key=("id",), strategy="snapshot_replace")
        measured = measure(ours_upsert(store, spec, cfg["batch"], detail))
        check = id_counts("ours", store=store, name=name) if rep == 0 else None
    else:
        path = str(Path(cfg["delta_root"]) / name)
        measured = measure(delta_upsert(path, cfg["batch"], detail))
        check = id_counts("delta", path=path) if rep == 0 else None
    return {**measured, "detail": detail, "check": check}


def child_main(payload_path: str) -> None:
    import json
    import warnings

    warnings.simplefilter("ignore")
    p = json.loads(Path(payload_path).read_text())
    if p["what"] == "prep":
        result = prep(p["cfg"], p["engine"], p["rep"])
    else:
        result = timed(p["cfg"], p["engine"], p["rep"])
    print(json.dumps(result), flush=True)


def spawn(payload: dict[str, Any], tag: str, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """This script as a fresh child on `payload` (`bench_spread.spawn`)."""
    return spawn_child(payload, tag, workdir, timeout_s, script=Path(__file__))


def make_batch(rows: int, path: Path) -> None:
    import polars as pl

    matched = pl.int_range(0, rows, eager=True).sample(500, seed=36)
    new = pl.int_range(rows, rows + 500, eager=True)
    frame = pl.concat([_rows(matched, changed=True), _rows(new, changed=False)])
    frame.sample(fraction=1.0, shuffle=True, seed=7).write_parquet(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--per-file", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    workdir = HERE / ".work" / "small"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    wall = time.perf_counter()
    server, sqlalchemy_uri, libpq_uri = start_postgres(workdir)
    rows = args.files * args.per_file
    failed = False
    try:
        print("== pipeline-output benchmark: upsert 1,000 keys into a table of small files ==")
        for ln in machine(libpq_uri):
            print(ln)
        print(
            f"table:    {args.files:,} files of {args.per_file} rows ({rows:,} rows); batch 500 "
            f"matched + 500 new; {args.reps} rep(s), each a fresh process\n",
            flush=True,
        )
        batch = workdir / "batch.parquet"
        make_batch(rows, batch)
        cfg = {
            "sqlalchemy_uri": sqlalchemy_uri,
            "libpq_uri": libpq_uri,
            "warehouse": f"file://{workdir / 'warehouse'}",
            "delta_root": str(workdir / "delta"),
            "batch": str(batch),
            "files": args.files,
            "per_file": args.per_file,
        }
        for engine in ENGINES:
            for rep in range(args.reps):
                t0 = time.perf_counter()
                payload = {"what": "prep", "engine": engine, "rep": rep, "cfg": cfg}
                got = spawn(payload, f"prep-{engine}-{rep}", workdir, 3600)
                print(f"prep {engine} rep {rep + 1}: {got} in {time.perf_counter() - t0:.0f} s")
                if got.get("files") != args.files:
                    print(f"prep {engine}: wrong file count, stopping", file=sys.stderr)
                    return 1
        runs: dict[str, list[dict[str, Any]]] = {e: [] for e in ENGINES}
        for rep in range(args.reps):
            order = ENGINES if rep % 2 == 0 else ENGINES[::-1]
            for engine in order:
                payload = {"what": "timed", "engine": engine, "rep": rep, "cfg": cfg}
                got = spawn(payload, f"{engine}-r{rep}", workdir, 1800)
                if "failure" in got:
                    print(f"  rep {rep + 1} {engine}: {got['failure']}")
                    failed = True
                    continue
                runs[engine].append(got)
                print(
                    f"  rep {rep + 1} {engine:<5} {fmt_s(got['seconds'])} s, peak "
                    f"{fmt_mb(got['peak_mb'])} MB (+{fmt_mb(got['call_mb'])} over the call); "
                    f"{got['detail']}",
                    flush=True,
                )
                check = got["check"]
                if check and not (check[0] == rows + 500 == check[1]):
                    print(f"  CHECK FAILED: {check}, want {rows + 500} unique ids")
                    failed = True
        print("\n== results (median seconds, min-max; peak RSS: max over reps) ==")
        med = {}
        for engine in ENGINES:
            secs = [r["seconds"] for r in runs[engine]]
            if not secs:
                continue
            peak = max(r["peak_mb"] for r in runs[engine])
            med[engine] = (statistics.median(secs), peak)
            print(
                f"{engine:<6} {fmt_s(statistics.median(secs))} s ({fmt_s(min(secs))}-"
                f"{fmt_s(max(secs))}), peak RSS {fmt_mb(peak)} MB"
            )
        if len(med) == 2:
            t = med["ours"][0] / med["delta"][0]
            r = med["ours"][1] / med["delta"][1]
            print(
                f"- time, ours / delta-rs <= 0.5x: {t:.2f}x ({'meets' if t <= 0.5 else 'MISSES'})"
            )
            print(
                f"- peak RSS, ours / delta-rs <= 0.5x: {r:.2f}x ({'meets' if r <= 0.5 else 'MISSES'})"
            )
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nload avg at end: {load}; wall time {time.perf_counter() - wall:.0f} s")
    finally:
        server.cleanup()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
