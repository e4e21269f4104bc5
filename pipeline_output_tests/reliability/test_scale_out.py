"""Scale-out: 4 real processes materialise window partitions of ONE delta dataset at the same time,
sharing one Postgres (ledger + SQL catalog) and one warehouse — every window is applied exactly once.

The windows are planned in the ledger first (`WindowLedger.plan`, what the window sensor records).
Each process runs the real asset job against its own ephemeral Dagster instance (the ledger and the
catalog are what coordinate them), as the window sensor requests runs: partition-range runs over
consecutive windows. Worker i runs the range of its own block of windows, then the next worker's
block — as a second range run (even workers) or as single-window runs in reverse order (odd
workers: a single-window retry racing a range run). Every window is so tried twice, by two
processes, at different times. The dataset is `append_always`, so a window applied twice would show
as duplicate rows. Checked: every ledger row `applied` after exactly one attempt, each window
carried by exactly one snapshot (the one the ledger records), one snapshot per window in total,
and the table equal to the source (the polars oracle of a plain copy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pytest

from pipeline_output import Window
from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime
from pipeline_output_tests.oracle import assert_same_multiset

NAME = "ev_scale"
WORKERS = 4

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    import dagster as dg
    import polars as pl

    from pipeline_output import Delta, build_definitions, dataset, postgres_source

    runs = json.loads(sys.argv[1])  # each: [key] (one window) or [first, last] (a range)
    barrier = Path(sys.argv[2])

    raw = postgres_source("ev", table="ev", watermark="seq")

    @dataset(
        "ev_scale", strategy="append_always", mode="iceberg",
        delta=Delta(source="ev", watermark="seq"),
    )
    def ev_scale(ev: pl.LazyFrame) -> pl.DataFrame:
        return ev.select("id", "v", "seq").collect()

    defs = build_definitions(datasets=[ev_scale], sources=[raw])
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ev_scale__windows", json.loads(sys.argv[3]))
        Path(barrier, f"ready-{os.getpid()}").touch()
        deadline = time.time() + 120
        while not Path(barrier, "go").exists():
            if time.time() > deadline:
                sys.exit("barrier timeout")
            time.sleep(0.005)
        for run in runs:
            where = (
                {"partition_key": run[0]} if len(run) == 1 else {"tags": {
                    "dagster/asset_partition_range_start": run[0],
                    "dagster/asset_partition_range_end": run[1],
                }}
            )
            result = job.execute_in_process(
                instance=instance, asset_selection=[dg.AssetKey("ev_scale")],
                raise_on_error=False, **where,
            )
            out = {"run": run, "success": result.success}
            print("RESULT " + json.dumps(out, default=str), flush=True)
    """
)


def make_source(url: str, n_rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ev (id bigint PRIMARY KEY, v text NOT NULL, seq bigint)")
        cur.executemany(
            "INSERT INTO ev (id, v, seq) VALUES (%s, %s, %s)",
            [(i, f"v{i}", i) for i in range(1, n_rows + 1)],
        )


def source_frame(url: str) -> pl.DataFrame:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, v, seq FROM ev ORDER BY id").fetchall()
    return pl.DataFrame(
        rows, schema={"id": pl.Int64, "v": pl.String, "seq": pl.Int64}, orient="row"
    )


def assignments(keys: list[str], workers: int) -> list[list[list[str]]]:
    """Worker i runs its own block of windows as one range run, then the next worker's block
    (wrapping): as a range run (even i) or as single-window runs in reverse order (odd i). Every
    window is so attempted by exactly two workers, at different times."""
    block = len(keys) // workers
    blocks = [keys[i * block : (i + 1) * block] for i in range(workers)]
    plans = []
    for i in range(workers):
        mine, nxt = blocks[i], blocks[(i + 1) % workers]
        second = [[nxt[0], nxt[-1]]] if i % 2 == 0 else [[k] for k in reversed(nxt)]
        plans.append([[mine[0], mine[-1]], *second])
    return plans


def covered(run: list[str], keys: list[str]) -> list[str]:
    """The window keys one run covers (a range: first..last in window order)."""
    return [k for k in keys if run[0] <= k <= run[-1]]


def run_workers(
    script: Path, plans: list[list[list[str]]], keys: list[str], barrier: Path
) -> list[dict[str, Any]]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), json.dumps(runs), str(barrier), json.dumps(keys)],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for runs in plans
    ]
    try:
        deadline = time.time() + 150
        while len(list(barrier.glob("ready-*"))) < len(procs):
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, [p.communicate()[1][-3000:] for p in dead]
            assert time.time() < deadline, "workers never reached the barrier"
            time.sleep(0.02)
        (barrier / "go").touch()
        results: list[dict[str, Any]] = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            lines = [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
            assert len(lines) == len(plans[procs.index(proc)]), (out[-2000:], err[-3000:])
            results.extend(lines)
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def windows_of(n_windows: int, width: int) -> list[Window]:
    return [Window(None if i == 0 else i * width, (i + 1) * width) for i in range(n_windows)]


@pytest.fixture
def env(runtime_env: Any, pg_db_url: str, tmp_path: Path) -> Any:
    script = tmp_path / "worker.py"
    script.write_text(CHILD)
    yield pg_db_url, script
    reset_runtime()


def check_scale_out(url: str, script: Path, tmp_path: Path, n_windows: int) -> None:
    width = 10
    make_source(url, n_windows * width)
    windows = windows_of(n_windows, width)
    get_runtime().windows.plan(NAME, windows)
    keys = [w.to_key() for w in windows]
    plans = assignments(keys, WORKERS)
    tried = sorted(k for runs in plans for run in runs for k in covered(run, keys))
    assert tried == sorted(keys * 2)  # each window twice
    assert sum(len(run) == 2 for runs in plans for run in runs) >= WORKERS + 1  # mostly ranges
    barrier = tmp_path / "barrier"
    barrier.mkdir()

    results = run_workers(script, plans, keys, barrier)

    assert all(r["success"] for r in results), [r for r in results if not r["success"]]
    assert len(results) == sum(len(runs) for runs in plans)

    # The ledger: every window applied after exactly one attempt, pointing at its snapshot.
    rows = {r.partition_key: r for r in get_runtime().windows.windows(NAME)}
    assert sorted(rows) == sorted(keys)
    table = get_runtime().iceberg.load(NAME)
    assert table is not None
    snaps = table.snapshots()
    assert len(snaps) == n_windows, f"{len(snaps)} snapshots for {n_windows} windows"
    carrying: dict[str, list[int]] = {}
    for snap in snaps:
        key = snap.summary.get("pipeline-output.window-key")
        carrying.setdefault(str(key), []).append(snap.snapshot_id)
    for key in keys:
        row = rows[key]
        assert row.state == "applied", row
        assert row.attempts == 1, row
        assert carrying.get(key) == [row.iceberg_snapshot_id], (key, carrying.get(key), row)

    # The table equals the oracle: the source copied once (a double apply would duplicate rows).
    got = get_runtime().iceberg.read(NAME).select("id", "v", "seq")
    assert_same_multiset(got, source_frame(url))


def test_four_processes_with_overlapping_windows_apply_each_window_exactly_once(env, tmp_path):
    url, script = env
    check_scale_out(url, script, tmp_path, n_windows=8)


@pytest.mark.slow
def test_four_processes_apply_32_windows_exactly_once(env, tmp_path):
    url, script = env
    check_scale_out(url, script, tmp_path, n_windows=32)
