"""Upserts spread over MANY data files, ours vs delta-rs and vs the floor (issues 13, 18, 36).

Run from the repository root:

    .venv/bin/python benchmarks/bench_spread.py                    # every case, 3 repetitions
    .venv/bin/python benchmarks/bench_spread.py --quick            # smoke run: N and B / 10, 1 rep
    .venv/bin/python benchmarks/bench_spread.py --only scale_1m    # substrings of case names

What it measures: a table of N rows in F data files (F sequential appends of N/F rows, file j
holding the ids [j*N/F, (j+1)*N/F)), then ONE upsert of B rows: B/2 existing ids drawn uniformly
over [0, N) with changed values (so every file holds matched keys) and B/2 new ids, shuffled.
Ours is `IcebergStore.write` with strategy `snapshot_replace` (a re-deploy upserts); delta-rs is
`DeltaTable.merge(...).when_matched_update_all().when_not_matched_insert_all()`. Both read the same
batch Parquet file. The floor (issue 36) is the least any engine must do for that upsert, run on
ours' table of the same repetition just before ours: plan the snapshot's files (pyiceberg), read
the touched files' key column (one polars scan of `id`), write the batch once as a data file,
and one commit (a fast append, to a branch `floor` so main is left for ours). The `spread2_*`
cases are the issue-36 series: 2 % of the table upserted, keys in every file, 20 / 50 / 100 / 200
files of 100,000 rows (targets: ours / floor <= 2x and ours / delta-rs <= 0.5x). `narrow4_2m`
(issue 44) is the spread2_2m upsert on a table of four narrow columns (`id`, `v_int`, `v_float`,
`flag`; twenty ~0.4 MB files, 8 MB under the copy-on-write budget), where `auto` must choose
between rewriting and keeping the files; ours with `auto` is also timed against ours forced to
copy-on-write (engine `cow`, its own tables), target ours / delta-rs <= 0.5x.

How: one embedded Postgres (the project's SQL catalog, FlatSqlCatalog, and the writer lock) under
`benchmarks/.work/spread/` (git-ignored; removed at the end unless --keep). Prep processes build
one fresh table per (case, engine, repetition) before anything is timed and check their file
counts. Every timed upsert then runs in its own fresh process, engines and repetitions
interleaved: it opens the table's catalog, reads the batch (polars for ours, pyarrow for
delta-rs), and times only the upsert call. Peak RSS is the process's `ru_maxrss` (interpreter,
imports and batch included), read as `VmHWM` from /proc/self/status, NOT `ru_maxrss`: on Linux a
child's `ru_maxrss` starts at its parent's RSS when it was spawned (the exec'd-over memory counts),
which would charge this parent's own memory to every child. `+N` is the peak over the call
(sampled every 5 ms) minus the RSS just before it. Times are medians (min-max shown), RSS the max over repetitions, ratios are
within this run. After the first repetition the child checks the table: N + B/2 rows, unique ids.
Exit code 0 even when a target is missed; non-zero only when something fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_iceberg_arm import CATALOG_NAME, NAMESPACE, _rows, fmt_mb, fmt_s, machine, start_postgres

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENGINES = ("ours", "delta", "floor", "cow")  # cow: ours forced to copy-on-write (narrow cases)


def engines_of(case: Case) -> tuple[str, ...]:
    """The engines measured on `case`: the narrow case also forces ours to copy-on-write, so the
    run shows what `auto`'s choice saves (or costs)."""
    return ENGINES if case.columns == "narrow" else ENGINES[:3]


@dataclass(frozen=True)
class Case:
    name: str
    rows: int  # N
    files: int  # F
    batch: int  # B
    columns: str = "wide"  # "wide": the six columns of `_rows`; "narrow": four narrow ones


CASES = [
    Case("narrow4_2m", 2_000_000, 20, 40_000, "narrow"),
    Case("spread2_2m", 2_000_000, 20, 40_000),
    Case("spread2_5m", 5_000_000, 50, 100_000),
    Case("spread2_10m", 10_000_000, 100, 200_000),
    Case("spread2_20m", 20_000_000, 200, 400_000),
    Case("spread_5m", 5_000_000, 50, 100_000),
    Case("scale_1m", 1_000_000, 10, 100_000),
    Case("scale_4m", 4_000_000, 40, 400_000),
    Case("scale_10m", 10_000_000, 100, 1_000_000),
]


def rows_of(case: Case, ids: Any, *, changed: bool) -> Any:
    """The case's columns for `ids`: `_rows`' six, or (narrow) its four narrow ones: `id`,
    `v_int`, `v_float`, `flag` (issue 44's `auto` case: ~1 MB files, cheap to rewrite)."""
    frame = _rows(ids, changed=changed)
    return frame.select("id", "v_int", "v_float", "flag") if case.columns == "narrow" else frame


def table_name(case: Case, rep: int, engine: str = "ours") -> str:
    """The table of `engine` (ours, the floor and delta-rs share names; `cow` has its own)."""
    return f"{case.name}_cow_r{rep}" if engine == "cow" else f"{case.name}_r{rep}"


# --------------------------------------------------------------------------------------------
# Child side
# --------------------------------------------------------------------------------------------


def ours_store(cfg: dict[str, Any]) -> Any:
    from pipeline_output import IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

    catalog = FlatSqlCatalog(CATALOG_NAME, uri=cfg["sqlalchemy_uri"], warehouse=cfg["warehouse"])
    return IcebergStore(catalog, NAMESPACE, lock=AdvisoryLock(cfg["libpq_uri"]))


def ours_spec(name: str, upsert: bool, hint: str = "auto") -> Any:
    """`append_always` builds the table file by file; a `snapshot_replace` re-deploy upserts
    (`hint`: its `write_strategy_hint`)."""
    from pipeline_output import DatasetSpec

    if upsert:
        return DatasetSpec(
            name=name,
            primary_key=("id",),
            strategy="snapshot_replace",
            write_strategy_hint=hint,  # type: ignore[arg-type]
        )
    return DatasetSpec(name=name, primary_key=("id",), strategy="append_always")


def ours_files(store: Any, name: str) -> int:
    return len(list(store.load(name).scan().plan_files()))


def prep(cfg: dict[str, Any], case: Case, engine: str, reps: int) -> dict[str, Any]:
    """Build `reps` tables of `case` with `engine`, F appends each; return their file counts."""
    import polars as pl

    per_file = case.rows // case.files
    counts = []
    store = ours_store(cfg) if engine in ("ours", "cow") else None
    for rep in range(reps):
        name = table_name(case, rep, engine)
        path = str(Path(cfg["delta_root"]) / name)
        for j in range(case.files):
            ids = pl.int_range(j * per_file, (j + 1) * per_file, eager=True)
            frame = rows_of(case, ids, changed=False)
            if store is not None:
                store.write(ours_spec(name, upsert=False), frame)
            else:
                from deltalake import write_deltalake

                write_deltalake(path, frame.to_arrow(), mode="append")
        if store is not None:
            counts.append(ours_files(store, name))
        else:
            from deltalake import DeltaTable

            counts.append(len(DeltaTable(path).file_uris()))
    return {"files": counts}


def vm_hwm() -> int:
    """This process's peak RSS in bytes since its exec (unlike `ru_maxrss`, not its parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


class PeakSampler(threading.Thread):
    """The process's RSS, sampled every 5 ms until stopped; `peak` is the largest seen."""

    def __init__(self) -> None:
        import psutil

        super().__init__(daemon=True)
        self.proc = psutil.Process()
        self.peak: int = self.proc.memory_info().rss
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, int(self.proc.memory_info().rss))


def ours_upsert(store: Any, spec: Any, batch: str, detail: dict[str, Any]) -> Any:
    """The call that upserts the parquet file `batch` into ours' table (counts into `detail`)."""
    import polars as pl

    data = pl.read_parquet(batch)

    def call() -> None:
        res = store.write(spec, data)
        detail.update(
            rewritten=res.files_rewritten,
            merged_on_read=res.files_merged_on_read,
            updated=res.rows_updated,
            inserted=res.rows_inserted,
        )

    return call


DELTA_METRICS = ("files_removed", "files_added", "rows_updated", "rows_inserted", "rows_copied")


def delta_upsert(path: str, batch: str, detail: dict[str, Any]) -> Any:
    """The call that merges the parquet file `batch` into the delta-rs table at `path` by `id`."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    data = pq.read_table(batch)

    def call() -> None:
        metrics = (
            DeltaTable(path)
            .merge(source=data, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        for key in DELTA_METRICS:
            detail[key] = metrics.get(f"num_target_{key}")

    return call


def measure(call: Any) -> dict[str, float]:
    """Run `call` once: its seconds, the process's peak RSS, the call's own peak over the RSS
    before it, and that RSS (MB)."""
    import psutil

    rss_before = psutil.Process().memory_info().rss
    sampler = PeakSampler()
    sampler.start()
    started = time.perf_counter()
    call()
    seconds = time.perf_counter() - started
    call_peak = sampler.stop()
    return {
        "seconds": seconds,
        "peak_mb": vm_hwm() / 2**20,
        "call_mb": (call_peak - rss_before) / 2**20,
        "before_mb": rss_before / 2**20,
    }


def id_counts(engine: str, *, store: Any = None, name: str = "", path: str = "") -> list[int]:
    """[rows, distinct ids] of the table after the write (ours by `store`/`name`, delta by
    `path`)."""
    if engine == "ours":
        ids = store.read(name, columns=["id"])["id"]
        return [ids.len(), ids.n_unique()]
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    arrow_ids = DeltaTable(path).to_pyarrow_dataset().to_table(columns=["id"])["id"]
    return [len(arrow_ids), pc.count_distinct(arrow_ids).as_py()]


def timed(cfg: dict[str, Any], case: Case, engine: str, rep: int) -> dict[str, Any]:
    """One upsert; only the call is timed. Rep 0 also checks the table afterwards."""

    name = table_name(case, rep, engine)
    detail: dict[str, Any] = {}
    if engine == "floor":
        import polars as pl

        store = ours_store(cfg)
        data = pl.read_parquet(cfg["batch"][case.name])

        def call() -> None:
            detail.update(floor(store, name, data))

    elif engine in ("ours", "cow"):
        store = ours_store(cfg)
        hint = "copy-on-write" if engine == "cow" else "auto"
        spec = ours_spec(name, upsert=True, hint=hint)
        call = ours_upsert(store, spec, cfg["batch"][case.name], detail)
    else:
        from deltalake import DeltaTable

        path = str(Path(cfg["delta_root"]) / name)
        call = delta_upsert(path, cfg["batch"][case.name], detail)

    measured = measure(call)

    # after the measurement: files left, and (rep 0) the rows are right
    check = None
    expected = case.rows + case.batch // 2
    if engine == "floor":
        pass
    elif engine in ("ours", "cow"):
        detail["files_after"] = ours_files(store, name)
        summary = store.load(name).current_snapshot().summary
        # rows the write put in data files (rewritten + new) and rows it deleted by position
        detail["rows_written"] = int(summary.get("added-records", "0") or 0)
        detail["position_deletes"] = int(summary.get("added-position-deletes", "0") or 0)
        if rep == 0:
            check = id_counts("ours", store=store, name=name)
    else:
        detail["files_after"] = len(DeltaTable(path).file_uris())
        if rep == 0:
            check = id_counts("delta", path=path)
    return {
        **measured,
        "detail": detail,
        "check": None
        if check is None
        else {"rows": check[0], "unique": check[1], "want": expected},
    }


def floor(store: Any, name: str, data: Any) -> dict[str, Any]:
    """The least an upsert of `data` must do (see the module doc): plan, read the touched files'
    keys, write the batch once, one commit (to branch `floor`: main is ours' to upsert next)."""
    import uuid

    import polars as pl

    from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter

    table = store.load(name)
    paths = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    keys = pl.scan_parquet(paths).select("id").collect()
    touched = keys.join(data.select("id"), on="id", how="semi").height
    written = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4()).write(
        data.sort("id").select(table.schema().column_names)
    )
    with table.transaction() as tx, tx.update_snapshot(branch="floor").fast_append() as append:
        for data_file in written:
            append.append_data_file(data_file)
    return {"files_read": len(paths), "keys_read": keys.height, "matched": touched}


def child_main(payload_path: str) -> None:
    import warnings

    warnings.simplefilter("ignore")
    p = json.loads(Path(payload_path).read_text())
    case = Case(**p["case"])
    if p["what"] == "prep":
        result = prep(p["cfg"], case, p["engine"], p["reps"])
    else:
        result = timed(p["cfg"], case, p["engine"], p["rep"])
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


def spawn(
    payload: dict[str, Any],
    tag: str,
    workdir: Path,
    timeout_s: float,
    *,
    script: Path = Path(__file__),
) -> dict[str, Any]:
    """Run `script` (default: this one) as a fresh child on `payload` (`--child PAYLOAD`); its
    last stdout line is the JSON result."""
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    payload_path = logs / f"{tag}.json"
    payload_path.write_text(json.dumps(payload))
    log_path = logs / f"{tag}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script.resolve()), "--child", str(payload_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=str(REPO),
            start_new_session=True,
            text=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"failure": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode < 0:
        return {"failure": f"crashed (signal {signal.Signals(-proc.returncode).name})"}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = log_path.read_text().strip().splitlines()[-1:] or ["?"]
        return {"failure": f"failed (exit {proc.returncode}): {tail[0][:160]} (see {log_path})"}
    return dict(json.loads(lines[-1]))


def make_batch(case: Case, path: Path) -> None:
    """B/2 existing ids uniform over [0, N) with changed values + B/2 new ids, shuffled."""
    import polars as pl

    half = case.batch // 2
    matched = pl.int_range(0, case.rows, eager=True).sample(half, seed=13)
    new = pl.int_range(case.rows, case.rows + half, eager=True)
    frame = pl.concat([rows_of(case, matched, changed=True), rows_of(case, new, changed=False)])
    frame.sample(fraction=1.0, shuffle=True, seed=18).write_parquet(path)


@dataclass
class Outcome:
    runs: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None

    @property
    def seconds(self) -> float | None:
        return statistics.median(r["seconds"] for r in self.runs) if self.runs else None

    @property
    def peak_mb(self) -> float | None:
        return max(r["peak_mb"] for r in self.runs) if self.runs else None

    def time_cell(self) -> str:
        if not self.runs:
            return self.failure or "-"
        secs = [r["seconds"] for r in self.runs]
        return f"{fmt_s(self.seconds)} ({fmt_s(min(secs))}-{fmt_s(max(secs))})"

    def rss_cell(self) -> str:
        if not self.runs:
            return "-"
        return f"{fmt_mb(self.peak_mb)} (+{fmt_mb(max(r['call_mb'] for r in self.runs))})"

    def check_problem(self) -> str | None:
        if self.failure:
            return self.failure
        for r in self.runs:
            c = r["check"]
            if c and not (c["rows"] == c["want"] and c["unique"] == c["rows"]):
                return f"{c['rows']:,} rows, {c['unique']:,} unique ids, want {c['want']:,}"
        return None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt_x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render(cases: list[Case], res: dict[tuple[str, str], Outcome]) -> list[str]:
    lines = [
        "| case | rows | files | batch | ours median s (min-max) | delta-rs median s (min-max) "
        "| ours/delta-rs | floor median s (min-max) | ours/floor | ours peak RSS MB | delta-rs peak RSS MB | ours RSS / delta-rs "
        "| ours files rewritten / merged on read → files after | ours rows written "
        "(+ deleted by position) | delta-rs files removed → added | delta-rs rows written | "
        "check |",
        "|---|---:|---:|---:|---|---|---:|---|---:|---:|---:|---:|---|---|---|---|---|",
    ]
    for c in cases:
        o, d, f = res[(c.name, "ours")], res[(c.name, "delta")], res[(c.name, "floor")]
        od = o.runs[0]["detail"] if o.runs else {}
        dd = d.runs[0]["detail"] if d.runs else {}
        problems = [
            f"{e}: {p}" for e, oc in (("ours", o), ("delta-rs", d)) if (p := oc.check_problem())
        ]
        lines.append(
            f"| {c.name} | {c.rows:,} | {c.files} | {c.batch:,} | {o.time_cell()} | "
            f"{d.time_cell()} | {fmt_x(ratio(o.seconds, d.seconds))} | {f.time_cell()} | "
            f"{fmt_x(ratio(o.seconds, f.seconds))} | {o.rss_cell()} | "
            f"{d.rss_cell()} | {fmt_x(ratio(o.peak_mb, d.peak_mb))} | "
            f"{od.get('rewritten', '-')} / {od.get('merged_on_read', '-')} → "
            f"{od.get('files_after', '-')} | "
            f"{od.get('rows_written', 0):,} (+{od.get('position_deletes', 0):,}) | "
            f"{dd.get('files_removed', '-')} → {dd.get('files_added', '-')} | "
            f"{dd.get('rows_copied', 0) + dd.get('rows_updated', 0) + dd.get('rows_inserted', 0):,} | "
            f"{'FAILED ' + '; '.join(problems) if problems else 'ok'} |"
        )
    return lines


def verdicts(cases: list[Case], res: dict[tuple[str, str], Outcome]) -> list[str]:
    def line(what: str, value: float | None, bound: float, shown: str) -> str:
        if value is None:
            return f"- {what}: n/a (a run failed)"
        return f"- {what}: {shown} ({'meets' if value <= bound else 'MISSES'})"

    out = []
    for c in cases:
        o, d = res[(c.name, "ours")], res[(c.name, "delta")]
        t = ratio(o.seconds, d.seconds)
        if c.name == "narrow4_2m":  # issue 44: `auto` chooses between rewriting and keeping
            fl = ratio(o.seconds, res[(c.name, "floor")].seconds)
            out.append(
                line(f"{c.name} time, ours / delta-rs <= 0.5x", t, 0.5, fmt_x(t))
                + f" [{fmt_s(o.seconds)} s vs {fmt_s(d.seconds)} s; ours / floor {fmt_x(fl)}]"
            )
            cow = res[(c.name, "cow")]
            od = o.runs[0]["detail"] if o.runs else {}
            chose = (
                f"{od.get('rewritten', '-')} file(s) rewritten, "
                f"{od.get('merged_on_read', '-')} kept with delete files"
            )
            out.append(
                f"- {c.name} auto's choice ({chose}) / forced copy-on-write: "
                f"{fmt_x(ratio(o.seconds, cow.seconds))} [{fmt_s(o.seconds)} s vs "
                f"{cow.time_cell()} s; delta-rs / forced copy-on-write "
                f"{fmt_x(ratio(d.seconds, cow.seconds))}]"
            )
            continue
        if c.name.startswith("spread2_"):  # issue 36
            fl = ratio(o.seconds, res[(c.name, "floor")].seconds)
            out.append(
                line(f"{c.name} time, ours / floor <= 2x", fl, 2.0, fmt_x(fl))
                + f" [{fmt_s(o.seconds)} s vs {fmt_s(res[(c.name, 'floor')].seconds)} s]"
            )
            out.append(
                line(f"{c.name} time, ours / delta-rs <= 0.5x", t, 0.5, fmt_x(t))
                + f" [{fmt_s(o.seconds)} s vs {fmt_s(d.seconds)} s]"
            )
            continue
        if c.name not in ("spread_5m", "scale_10m"):  # the issues set no target for these
            r = ratio(o.peak_mb, d.peak_mb)
            out.append(
                f"- {c.name} (for information): time {fmt_x(t)}, peak RSS {fmt_x(r)} of delta-rs "
                f"[{fmt_s(o.seconds)} s vs {fmt_s(d.seconds)} s; "
                f"{fmt_mb(o.peak_mb)} MB vs {fmt_mb(d.peak_mb)} MB]"
            )
            continue
        limit = 0.5 if c.name == "spread_5m" else 1.0
        out.append(
            line(f"{c.name} time, ours / delta-rs <= {limit:g}x", t, limit, fmt_x(t))
            + f" [{fmt_s(o.seconds)} s vs {fmt_s(d.seconds)} s]"
        )
        if c.name == "spread_5m":
            out.append(
                line("spread_5m ours peak RSS <= 462 MB", o.peak_mb, 462, f"{fmt_mb(o.peak_mb)} MB")
                + f" [delta-rs {fmt_mb(d.peak_mb)} MB]"
            )
        else:
            r = ratio(o.peak_mb, d.peak_mb)
            out.append(
                line(f"{c.name} peak RSS, ours <= delta-rs", r, 1.0, fmt_x(r))
                + f" [{fmt_mb(o.peak_mb)} MB vs {fmt_mb(d.peak_mb)} MB]"
            )
    return out


def growth(cases: list[Case], res: dict[tuple[str, str], Outcome]) -> list[str]:
    """Per million table rows for the scaling cases, and exponents from the smallest to largest.

    Peak RSS carries a fixed floor (interpreter, imports, batch); `+call` is the growth over the
    call, the part that scales with the table.
    """
    scale = [c for c in cases if c.name.startswith("scale_")]
    out = []
    for engine, label in (("ours", "ours"), ("delta", "delta-rs")):
        cells, points = [], []
        for c in scale:
            oc, m = res[(c.name, engine)], c.rows / 1e6
            if oc.seconds is None or oc.peak_mb is None:
                cells.append(f"{m:g}M n/a")
                continue
            call = max(r["call_mb"] for r in oc.runs)
            cells.append(
                f"{m:g}M {oc.seconds / m:.3f} s/M, peak {oc.peak_mb / m:.0f} MB/M, "
                f"+call {call / m:.0f} MB/M"
            )
            points.append((c.rows, oc.seconds, oc.peak_mb, max(call, 1e-3)))
        law = ""
        if len(points) >= 2:
            (n0, *first), (n1, *last) = points[0], points[-1]
            k = math.log(n1 / n0)
            t, p, a = (math.log(y / x) / k for x, y in zip(first, last, strict=True))
            law = (
                f"; {n0 / 1e6:g}M to {n1 / 1e6:g}M: time ~ N^{t:.2f}, peak RSS ~ N^{p:.2f}, "
                f"+call RSS ~ N^{a:.2f}"
            )
        if scale:
            out.append(
                f"- growth {label} (10% upserts, per million table rows): {'; '.join(cells)}{law}"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", default=None, help="comma-separated substrings of case names")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per case (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: N and B / 10, 1 repetition")
    ap.add_argument("--keep", action="store_true", help="keep benchmarks/.work/spread afterwards")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0

    cases = CASES
    if args.only:
        pats = [p.strip() for p in args.only.split(",") if p.strip()]
        cases = [c for c in CASES if any(p in c.name for p in pats)]
        if not cases:
            ap.error(f"--only {args.only!r} matches none of {[c.name for c in CASES]}")
    if args.quick:
        cases = [Case(c.name, c.rows // 10, c.files, c.batch // 10, c.columns) for c in cases]
    reps = args.reps or (1 if args.quick else 3)

    workdir = HERE / ".work" / "spread"
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "in").mkdir(parents=True)
    t_start = time.perf_counter()
    server, sqlalchemy_uri, libpq_uri = start_postgres(workdir)
    failed = False
    try:
        print("== pipeline-output benchmark: upserts spread over many data files, vs delta-rs ==")
        for ln in machine(libpq_uri):
            print(ln)
        print(
            f"method:   {reps} rep(s) per case and engine, each a fresh process; "
            f"{'QUICK (N and B / 10)' if args.quick else 'full sizes'}\n",
            flush=True,
        )
        batches = {}
        for c in cases:
            batches[c.name] = str(workdir / "in" / f"{c.name}.parquet")
            make_batch(c, Path(batches[c.name]))
        cfg = {
            "sqlalchemy_uri": sqlalchemy_uri,
            "libpq_uri": libpq_uri,
            "warehouse": f"file://{workdir / 'warehouse'}",
            "delta_root": str(workdir / "delta"),
            "batch": batches,
        }

        res = {(c.name, e): Outcome() for c in cases for e in ENGINES}
        for c in cases:  # setup, never timed (the floor runs on ours' tables)
            for e in [e for e in engines_of(c) if e != "floor"]:
                t0 = time.perf_counter()
                payload = {"what": "prep", "case": asdict(c), "engine": e, "reps": reps, "cfg": cfg}
                got = spawn(payload, f"prep-{c.name}-{e}", workdir, 3600)
                if "failure" in got:
                    res[(c.name, e)].failure = f"prep {got['failure']}"
                elif got["files"] != [c.files] * reps:
                    res[(c.name, e)].failure = f"prep made {got['files']} files, want {c.files}"
                print(
                    f"prep {c.name} {e}: {reps} table(s) of {c.rows:,} rows in {c.files} files, "
                    f"{time.perf_counter() - t0:.0f} s {res[(c.name, e)].failure or ''}",
                    flush=True,
                )

        for rep in range(reps):  # repetition-major, engine order alternating
            for i, c in enumerate(cases):
                # the floor runs on ours' table, before ours (it leaves main as it was)
                first = (rep + i) % 2 == 0
                order = (
                    ("floor", "ours", "delta", "cow")
                    if first
                    else ("cow", "delta", "floor", "ours")
                )
                for e in [e for e in order if e in engines_of(c)]:
                    oc = res[(c.name, e)]
                    if e == "floor" and res[(c.name, "ours")].failure:
                        oc.failure = "ours' table failed"
                    if oc.failure:
                        continue
                    payload = {
                        "what": "timed",
                        "case": asdict(c),
                        "engine": e,
                        "rep": rep,
                        "cfg": cfg,
                    }
                    got = spawn(payload, f"{c.name}-{e}-r{rep}", workdir, 1800)
                    if "failure" in got:
                        oc.failure = got["failure"]
                        status = oc.failure
                    else:
                        oc.runs.append(got)
                        status = (
                            f"{fmt_s(got['seconds'])} s, peak {fmt_mb(got['peak_mb'])} MB, "
                            f"{fmt_mb(got['before_mb'])} MB before the call, "
                            f"+{fmt_mb(got['call_mb'])} over it; {got['detail']}"
                        )
                    print(f"  rep {rep + 1} {c.name:<10} {e:<5} {status}", flush=True)

        print(
            "\n== results (median seconds, min-max; peak RSS: max over reps, +peak over the call) =="
        )
        for ln in render(cases, res):
            print(ln)
        print()
        for ln in verdicts(cases, res) + growth(cases, res):
            print(ln)
        failed = any(oc.check_problem() for oc in res.values())
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nload avg at end: {load}; wall time {time.perf_counter() - t_start:.0f} s")
    finally:
        server.cleanup()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
