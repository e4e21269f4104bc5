"""Scale-out: 4 real processes materialise window partitions of ONE delta dataset at the same time,
sharing one Postgres (ledger + SQL catalog) and one warehouse — every window is applied exactly once.

The windows are planned in the ledger first (`WindowLedger.plan`, what the window sensor records).
Each process runs the real asset job (`execute_in_process(partition_key=...)` against its own
ephemeral Dagster instance: the ledger and the catalog are what coordinate them), one run per window,
over an assignment that overlaps another process's (every window is attempted by two processes,
in different orders). The dataset is `append_always`, so a window applied twice would show as
duplicate rows. Checked: every ledger row `applied` after exactly one attempt, each window carried
by exactly one snapshot (the one the ledger records), one snapshot per window in total, and the
table equal to the source (the polars oracle of a plain copy).
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
from pipeline_output.dagster_layer.process_runtime import get_runtime, reset_runtime
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

    keys = sys.argv[1].split(",")
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
        instance.add_dynamic_partitions("ev_scale__windows", keys)
        Path(barrier, f"ready-{os.getpid()}").touch()
        deadline = time.time() + 120
        while not Path(barrier, "go").exists():
            if time.time() > deadline:
                sys.exit("barrier timeout")
            time.sleep(0.005)
        for key in keys:
            result = job.execute_in_process(
                instance=instance, asset_selection=[dg.AssetKey("ev_scale")],
                partition_key=key, raise_on_error=False,
            )
            meta = {}
            for event in result.get_asset_materialization_events():
                for k, v in event.materialization.metadata.items():
                    value = getattr(v, "value", v)
                    if isinstance(value, (int, float, str, bool)) or value is None:
                        meta[k] = value
            out = {"key": key, "success": result.success, "meta": meta}
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


def assignments(keys: list[str], workers: int) -> list[list[str]]:
    """Worker i gets its own block of windows and the next worker's block (wrapping), the latter
    in reverse order: every window is attempted by exactly two workers, at different times."""
    block = len(keys) // workers
    blocks = [keys[i * block : (i + 1) * block] for i in range(workers)]
    return [blocks[i] + list(reversed(blocks[(i + 1) % workers])) for i in range(workers)]


def run_workers(script: Path, plans: list[list[str]], barrier: Path) -> list[dict[str, Any]]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), ",".join(keys), str(barrier)],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for keys in plans
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
    assert sorted(k for p in plans for k in p) == sorted(keys * 2)  # each window twice
    barrier = tmp_path / "barrier"
    barrier.mkdir()

    results = run_workers(script, plans, barrier)

    assert all(r["success"] for r in results), [r for r in results if not r["success"]]
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_key.setdefault(r["key"], []).append(r["meta"])
    for key in keys:
        metas = by_key[key]
        assert len(metas) == 2, (key, metas)
        assert sorted(m["windows_applied"] for m in metas) == [0, 1], (key, metas)
        assert sorted(m["windows_skipped"] for m in metas) == [0, 1], (key, metas)

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
