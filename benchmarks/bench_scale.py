"""Scale-out benchmark: window runs with 1, 2 and 4 concurrent runs (real processes).

Two workloads, each N window runs (one Dagster run per window, the real asset job through
`execute_in_process(partition_key=...)` in a worker process, each worker with its own ephemeral
Dagster instance; the ledger, the advisory locks and the Iceberg SQL catalog are shared in one
Postgres, the warehouse is local `file://`):

- `one-dataset`: N windows of ONE `append_always` delta dataset;
- `M-datasets`: N windows spread over M independent delta datasets (N/M each).

Executor: N worker processes each running `execute_in_process` (NOT the Dagster daemon + queued
run coordinator; the run launcher is not what is measured here, the shared Postgres/catalog is).
Windows are assigned round-robin; a worker runs its windows in order. The clock starts when every
worker has imported everything and stops when the last run ends.

Reported per trial: windows/s, run wall time (p50), Iceberg lock wait (`lock_wait_s` of the write),
commit retries (metadata.json files written minus commits kept: each failed catalog swap leaves one)
advisory-lock wait (sampled from pg_stat_activity: the per-dataset window apply lock plus the
per-table Iceberg writer lock) CPU use (worker CPU time after the start signal / wall / cores) and the whole machine's busy and
iowait share (/proc/stat: workers, Postgres and this process).

    .venv/bin/python benchmarks/bench_scale.py                # default: N=24, M=4, rows/window 20k
    .venv/bin/python benchmarks/bench_scale.py --windows 48 --datasets 8 --rows 50000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
WORK = ROOT / ".work" / "scale"

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    import dagster as dg
    import polars as pl

    from pipeline_output import Delta, build_definitions, dataset, postgres_source

    plan = json.loads(Path(sys.argv[1]).read_text())
    barrier = Path(sys.argv[2])
    names = sorted({ds for ds, _ in plan["all"]})

    raw = postgres_source("ev", table="ev", watermark="seq")

    def make(name):
        @dataset(name, strategy="append_always", mode="iceberg",
                 delta=Delta(source="ev", watermark="seq"))
        def _ds(ev: pl.LazyFrame) -> pl.DataFrame:
            # a little real work per row, like a typical transform
            return ev.with_columns(
                (pl.col("v").str.len_chars() + pl.col("seq") % 7).alias("score")
            ).collect()
        return _ds

    defs = build_definitions(datasets=[make(n) for n in names], sources=[raw])
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.ephemeral() as instance:
        for n in names:
            instance.add_dynamic_partitions(
                f"{n}__windows", sorted({k for ds, k in plan["all"] if ds == n})
            )
        Path(barrier, f"ready-{os.getpid()}").touch()
        while not Path(barrier, "go").exists():
            time.sleep(0.002)
        cpu0 = time.process_time()
        for ds, key in plan["mine"]:
            t0 = time.perf_counter()
            result = job.execute_in_process(
                instance=instance, asset_selection=[dg.AssetKey(ds)],
                partition_key=key, raise_on_error=False,
            )
            wall = time.perf_counter() - t0
            meta = {}
            for event in result.get_asset_materialization_events():
                for k, v in event.materialization.metadata.items():
                    val = getattr(v, "value", v)
                    if isinstance(val, (int, float, str, bool)):
                        meta[k] = val
            print("RESULT " + json.dumps({
                "ds": ds, "key": key, "ok": result.success, "wall": wall,
                "lock_wait": meta.get("lock_wait_s"), "write_s": meta.get("duration_s"),
                "applied": meta.get("windows_applied"),
                "end": time.time(),
            }), flush=True)
        print("CPU " + json.dumps(time.process_time() - cpu0), flush=True)
    """
)


def pg_server() -> tuple[str, Any]:
    """(libpq URL, stop callable): PIPELINE_OUTPUT_PG_URL if set, else an embedded server."""
    if os.environ.get("PIPELINE_OUTPUT_PG_URL"):
        return os.environ["PIPELINE_OUTPUT_PG_URL"], lambda: None
    from pipeline_output import embedded_pg

    data = WORK / "pg"
    url = embedded_pg.start(data_dir=data)
    return url, lambda: embedded_pg.stop(data_dir=data)


def fresh_database(server_url: str) -> str:
    import psycopg
    from psycopg import sql

    from pipeline_output.settings import with_database

    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(with_database(server_url, database="postgres"), autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(server_url, database=name)


def drop_database(server_url: str, url: str) -> None:
    import psycopg
    from psycopg import sql

    from pipeline_output.settings import with_database

    name = url.rsplit("/", 1)[-1].split("?", 1)[0]
    with psycopg.connect(with_database(server_url, database="postgres"), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def make_source(url: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ev (id bigint PRIMARY KEY, v text NOT NULL, seq bigint)")
        conn.execute(
            "INSERT INTO ev SELECT g, 'value-' || g, g FROM generate_series(1, %s) AS g", (rows,)
        )


def count_retries(home: Path, names: list[str]) -> tuple[int, int]:
    """(metadata files written, commits kept) over the given tables."""
    from pyiceberg.catalog.sql import SqlCatalog  # noqa: F401  (same environment as workers)

    from pipeline_output.defs.runtime import get_runtime

    written = kept = 0
    for name in names:
        table = get_runtime().iceberg.load(name)
        if table is None:
            continue
        meta_dir = Path(table.location().removeprefix("file://")) / "metadata"
        written += len(list(meta_dir.glob("*.metadata.json")))
        kept += len(table.metadata.metadata_log) + 1
    return written, kept


def proc_stat() -> tuple[int, int, int]:
    """(busy, iowait, total) jiffies of the whole machine (Linux /proc/stat; zeros elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0, 0
    idle, iowait = fields[3], fields[4]
    total = sum(fields[:8])
    return total - idle - iowait, iowait, total


def pg_cpu_s() -> float:
    """CPU seconds used so far by the embedded Postgres (postmaster + reaped and live backends);
    0 when the server is external (PIPELINE_OUTPUT_PG_URL) or /proc is unavailable."""
    pid_file = WORK / "pg" / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return 0.0
    hz = os.sysconf("SC_CLK_TCK")

    def fields(p: str) -> list[str]:
        text = Path(f"/proc/{p}/stat").read_text()
        return text[text.rindex(")") + 2 :].split()

    try:
        own = fields(str(pid))
    except OSError:
        return 0.0
    ticks = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            f = fields(entry.name)
        except OSError:
            continue
        if int(f[1]) == pid:
            ticks += int(f[11]) + int(f[12])
    return ticks / hz


class AdvisoryWaitSampler(threading.Thread):
    """Integrates, every 20 ms, how many sessions of the trial's database wait on an advisory lock
    (the per-dataset window apply lock and the per-table Iceberg writer lock): seconds waited."""

    PERIOD = 0.02

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.waited_s = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._halt.is_set():
                t0 = time.perf_counter()
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                ).fetchone()  # type: ignore[misc]
                self._halt.wait(self.PERIOD)
                self.waited_s += n * (time.perf_counter() - t0)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def trial(
    server_url: str, workload: str, concurrency: int, n: int, m: int, rows_per_window: int
) -> dict[str, Any]:
    from pipeline_output import Window
    from pipeline_output.defs.runtime import get_runtime, reset_runtime

    url = fresh_database(server_url)
    home = WORK / f"home-{workload}-{concurrency}"
    shutil.rmtree(home, ignore_errors=True)
    os.environ["PIPELINE_OUTPUT_PG_URL"] = url
    os.environ["PIPELINE_OUTPUT_HOME"] = str(home)
    reset_runtime()
    try:
        make_source(url, n * rows_per_window)
        names = ["one"] if workload == "one-dataset" else [f"ds{i}" for i in range(m)]
        per = n // len(names)
        pairs: list[tuple[str, str]] = []
        for name in names:
            width = n * rows_per_window // per
            windows = [Window(None if i == 0 else i * width, (i + 1) * width) for i in range(per)]
            get_runtime().windows.plan(name, windows)
            pairs.extend((name, w.to_key()) for w in windows)
        # round-robin over window order (interleaving datasets in the M-datasets case)
        order = sorted(pairs, key=lambda p: (p[1], p[0]))
        barrier = WORK / f"barrier-{workload}-{concurrency}"
        shutil.rmtree(barrier, ignore_errors=True)
        barrier.mkdir(parents=True)
        procs = []
        for w in range(concurrency):
            plan_file = barrier / f"plan-{w}.json"
            plan_file.write_text(json.dumps({"all": pairs, "mine": order[w::concurrency]}))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, str(plan_file), str(barrier)],
                    env=dict(os.environ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        while len(list(barrier.glob("ready-*"))) < concurrency:
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(dead[0].communicate()[1][-3000:])
            time.sleep(0.02)
        sampler = AdvisoryWaitSampler(url)
        sampler.start()
        stat0 = proc_stat()
        pg0 = pg_cpu_s()
        started = time.time()
        (barrier / "go").touch()
        results = []
        cpu = 0.0
        for p in procs:
            out, err = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(err[-3000:])
            results += [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
            cpu += sum(json.loads(x[4:]) for x in out.splitlines() if x.startswith("CPU "))
        sampler.stop()
        stat1 = proc_stat()
        pg1 = pg_cpu_s()
        ticks = max(stat1[2] - stat0[2], 1)
        wall = max(r["end"] for r in results) - started
        written, kept = count_retries(home, names)
        failed = [r for r in results if not r["ok"]]
        applied = sum(r["applied"] or 0 for r in results)
        return {
            "workload": workload,
            "runs": concurrency,
            "windows": len(results),
            "applied": applied,
            "failed": len(failed),
            "wall_s": wall,
            "windows_per_s": len(results) / wall,
            "run_p50_s": statistics.median(r["wall"] for r in results),
            "write_p50_s": statistics.median(r["write_s"] or 0 for r in results),
            "lock_wait_total_s": sum(r["lock_wait"] or 0 for r in results),
            "lock_wait_max_s": max(r["lock_wait"] or 0 for r in results),
            "advisory_wait_s": sampler.waited_s,
            "commit_retries": written - kept,
            "cpu_util": cpu / wall / (os.cpu_count() or 1),
            "pg_cpu_util": (pg1 - pg0) / wall / (os.cpu_count() or 1),
            # the whole machine (workers + Postgres + this process), until the last worker exited
            "machine_busy": (stat1[0] - stat0[0]) / ticks,
            "machine_iowait": (stat1[1] - stat0[1]) / ticks,
        }
    finally:
        reset_runtime()
        drop_database(server_url, url)
        shutil.rmtree(home, ignore_errors=True)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=110)
    for workload in sorted({r["workload"] for r in rows}):
        pts = sorted((r["runs"], r["windows_per_s"]) for r in rows if r["workload"] == workload)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=workload)
    ax.set_xlabel("concurrent runs (worker processes)")
    ax.set_ylabel("windows / s")
    ax.set_xticks(sorted({r["runs"] for r in rows}))
    ax.set_ylim(bottom=0)
    ax.set_title(f"window runs, {os.cpu_count()} cores, shared Postgres + SQL catalog")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| workload | runs | windows | applied | failed | wall s | windows/s | run p50 s "
        "| write p50 s | Iceberg lock wait s (sum/max) | advisory wait s | commit retries "
        "| worker CPU | Postgres CPU | machine busy / iowait |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['runs']} | {r['windows']} | {r['applied']} | {r['failed']} "
            f"| {r['wall_s']:.1f} | {r['windows_per_s']:.2f} | {r['run_p50_s']:.2f} "
            f"| {r['write_p50_s']:.3f} | {r['lock_wait_total_s']:.2f} / {r['lock_wait_max_s']:.2f} "
            f"| {r['advisory_wait_s']:.1f} | {r['commit_retries']} | {r['cpu_util']:.0%} "
            f"| {r['pg_cpu_util']:.0%} "
            f"| {r['machine_busy']:.0%} / {r['machine_iowait']:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=24, help="N window runs per trial")
    parser.add_argument("--datasets", type=int, default=4, help="M independent datasets")
    parser.add_argument("--rows", type=int, default=20000, help="source rows per window")
    parser.add_argument("--runs", default="1,2,4", help="concurrent runs to try")
    parser.add_argument("--plot", default=str(ROOT / "scale.png"))
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    server, stop = pg_server()
    rows = []
    try:
        for workload in ("one-dataset", "M-datasets"):
            for c in [int(x) for x in args.runs.split(",")]:
                row = trial(server, workload, c, args.windows, args.datasets, args.rows)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        stop()
    print()
    print(
        f"executor: {max(int(x) for x in args.runs.split(','))} worker processes x "
        "execute_in_process (not the daemon); "
        f"N={args.windows} windows, M={args.datasets} datasets, {args.rows} rows/window, "
        f"{os.cpu_count()} cores"
    )
    print(table(rows))
    plot(rows, Path(args.plot))
    print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
