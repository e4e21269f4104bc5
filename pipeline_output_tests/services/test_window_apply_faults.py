"""Exactly-once window application under real process death and real concurrency.

Each scenario runs the window in a separate Python process (the real asset job, executed in that
process against the test's Postgres and Iceberg SQL catalog). `PIPELINE_OUTPUT_FAULT` makes the
process SIGKILL itself (a) before the Iceberg commit or (b) after the commit and before the ledger
update; (c) is a normal success followed by a retry. In every case the next attempt must leave the
window applied exactly once: the target equals the source rows up to the window (no duplicate, no
lost row — the dataset is `append_always`, so a double apply would show), the ledger records the
snapshot that carries the window's attempt marker, and only one snapshot carries the window.
Two processes racing on the same window: one applies, the other no-ops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from psycopg import sql

from pipeline_output import Delta, Window, build_definitions, dataset, postgres_source
from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime
from pipeline_output_tests.oracle import assert_same_multiset

NAME = "ev_log"

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    import dagster as dg
    import polars as pl

    from pipeline_output import Delta, build_definitions, dataset, postgres_source

    keys = sys.argv[1].split(",")
    barrier = sys.argv[2] if len(sys.argv) > 2 else None
    slow = float(os.environ.get("TEST_SLOW_COMPUTE_S", "0"))

    raw = postgres_source("ev", table="ev", watermark="seq")

    @dataset(
        "ev_log", strategy="append_always", mode="iceberg",
        delta=Delta(source="ev", watermark="seq"),
    )
    def ev_log(ev: pl.LazyFrame) -> pl.DataFrame:
        frame = ev.select("id", "v", "seq").collect()
        time.sleep(slow)
        return frame

    defs = build_definitions(datasets=[ev_log], sources=[raw])
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ev_log__windows", keys)
        if barrier:
            Path(barrier, f"ready-{os.getpid()}").touch()
            deadline = time.time() + 120
            while not Path(barrier, "go").exists():
                if time.time() > deadline:
                    sys.exit("barrier timeout")
                time.sleep(0.001)
        if len(keys) == 1:
            kwargs = {"partition_key": keys[0]}
        else:
            kwargs = {"tags": {
                "dagster/asset_partition_range_start": keys[0],
                "dagster/asset_partition_range_end": keys[-1],
            }}
        result = job.execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("ev_log")],
            raise_on_error=False, **kwargs,
        )
        meta = {}
        for event in result.get_asset_materialization_events():
            meta = {
                k: getattr(v, "value", v)
                for k, v in event.materialization.metadata.items()
                if isinstance(getattr(v, "value", v), (str, int, float, bool, type(None)))
            }
        print("RESULT " + json.dumps({"success": result.success, "meta": meta}, default=str))
    """
)


# --- helpers ---------------------------------------------------------------------------------------


def make_source(url: str, seqs: list[int]) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ev (id bigint PRIMARY KEY, v text NOT NULL, seq bigint)")
        cur.executemany(
            "INSERT INTO ev (id, v, seq) VALUES (%s, %s, %s)",
            [(i, f"v{i}", s) for i, s in enumerate(seqs, start=1)],
        )


def source_upto(url: str, high: int) -> pl.DataFrame:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, v, seq FROM ev WHERE seq <= %s ORDER BY id"), (high,)
        ).fetchall()
    return pl.DataFrame(
        rows, schema={"id": pl.Int64, "v": pl.String, "seq": pl.Int64}, orient="row"
    )


def in_process_defs() -> dg.Definitions:
    raw = postgres_source("ev", table="ev", watermark="seq")

    @dataset(
        NAME, strategy="append_always", mode="iceberg", delta=Delta(source="ev", watermark="seq")
    )
    def ev_log(ev: pl.LazyFrame) -> pl.DataFrame:
        return ev.select("id", "v", "seq").collect()

    return build_definitions(datasets=[ev_log], sources=[raw])


def run_child(
    script: Path,
    keys: list[str],
    *,
    fault: str | None = None,
    barrier: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("PIPELINE_OUTPUT_FAULT", None)
    if fault:
        env["PIPELINE_OUTPUT_FAULT"] = fault
    env.update(extra_env or {})
    args = [sys.executable, str(script), ",".join(keys)]
    if barrier is not None:
        args.append(str(barrier))
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(
    proc: subprocess.Popen[str], timeout: float = 180
) -> tuple[int, dict[str, Any] | None, str]:
    out, err = proc.communicate(timeout=timeout)
    result = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
    return proc.returncode, result, err


def run_in_process(instance: dg.DagsterInstance, keys: list[str]) -> dict[str, Any]:
    """The next attempt, in this process (no fault configured here)."""
    assert "PIPELINE_OUTPUT_FAULT" not in os.environ
    instance.add_dynamic_partitions(f"{NAME}__windows", keys)
    job = in_process_defs().resolve_implicit_global_asset_job_def()
    if len(keys) == 1:
        kwargs: dict[str, Any] = {"partition_key": keys[0]}
    else:
        kwargs = {
            "tags": {
                "dagster/asset_partition_range_start": keys[0],
                "dagster/asset_partition_range_end": keys[-1],
            }
        }
    result = job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(NAME)], **kwargs
    )
    meta = result.get_asset_materialization_events()[-1].materialization.metadata
    return {k: getattr(v, "value", v) for k, v in meta.items()}


def snapshots_for(key: str) -> list[Any]:
    table = get_runtime().iceberg.load(NAME)
    if table is None:
        return []
    return [s for s in table.snapshots() if s.summary.get("pipeline-output.window-key") == key]


def assert_applied_exactly_once(url: str, key: str) -> None:
    """The ledger says applied with the one snapshot carrying the window, and the table holds the
    window's source rows exactly once."""
    window = Window.from_key(key)
    row = get_runtime().windows.get(NAME, key)
    assert row is not None and row.state == "applied", row
    carrying = snapshots_for(key)
    assert len(carrying) == 1, f"{len(carrying)} snapshots carry window {key}"
    assert row.iceberg_snapshot_id == carrying[0].snapshot_id
    got = get_runtime().iceberg.read(NAME).select("id", "v", "seq")
    assert_same_multiset(
        got.filter(window.contains("seq")), source_upto(url, 10**9).filter(window.contains("seq"))
    )


def assert_table_is_source_upto(url: str, high: int) -> None:
    got = get_runtime().iceberg.read(NAME).select("id", "v", "seq")
    assert_same_multiset(got, source_upto(url, high))


@pytest.fixture
def env(runtime_env: Any, pg_db_url: str, tmp_path: Path) -> Any:
    make_source(pg_db_url, list(range(1, 21)))
    # two windows planned in the ledger: (-inf, 10] and (10, 20]
    get_runtime().windows.plan(NAME, [Window(None, 10), Window(10, 20)])
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    yield pg_db_url, script
    reset_runtime()


W1 = Window(None, 10).to_key()
W2 = Window(10, 20).to_key()


# --- (a) killed before the Iceberg commit ---------------------------------------------------------


@pytest.mark.parametrize("which", ["first-window", "second-window"])
def test_killed_before_commit_next_attempt_applies_the_window_once(env, instance, which):
    url, script = env
    if which == "second-window":
        run_in_process(instance, [W1])
    key = W1 if which == "first-window" else W2
    code, result, err = finish(run_child(script, [key], fault="before_commit"))
    assert code == -signal.SIGKILL, (code, result, err[-2000:])
    assert result is None
    row = get_runtime().windows.get(NAME, key)
    assert row is not None and row.state == "applying" and row.attempts == 1
    assert snapshots_for(key) == [], "nothing was committed before the kill"

    meta = run_in_process(instance, [key])
    assert meta["windows_applied"] == 1
    assert_applied_exactly_once(url, key)
    assert_table_is_source_upto(url, int(Window.from_key(key).high))
    row = get_runtime().windows.get(NAME, key)
    assert row is not None and row.attempts == 2
    carrying = snapshots_for(key)
    assert carrying[0].summary["pipeline-output.window-attempt"] == f"{row.id}:2"


# --- (b) killed after the Iceberg commit, before the ledger update ----------------------------


def test_killed_after_commit_next_attempt_repairs_the_ledger_without_a_second_write(env, instance):
    """On the first window (the commit that creates the table); the range test below covers a
    later window of an existing table."""
    url, script = env
    key = W1
    code, result, err = finish(run_child(script, [key], fault="after_commit"))
    assert code == -signal.SIGKILL, (code, result, err[-2000:])
    row = get_runtime().windows.get(NAME, key)
    assert row is not None and row.state == "applying", "the ledger update never happened"
    [committed] = snapshots_for(key)
    n_snapshots = len(get_runtime().iceberg.load(NAME).snapshots())

    meta = run_in_process(instance, [key])
    assert meta["windows_repaired"] == 1 and meta["windows_applied"] == 0
    assert_applied_exactly_once(url, key)
    assert_table_is_source_upto(url, 10)
    assert len(get_runtime().iceberg.load(NAME).snapshots()) == n_snapshots, "no second write"
    row = get_runtime().windows.get(NAME, key)
    assert row is not None and row.iceberg_snapshot_id == committed.snapshot_id
    assert row.attempts == 1

    # and a further retry is a plain no-op
    meta = run_in_process(instance, [key])
    assert meta["windows_skipped"] == 1
    assert_applied_exactly_once(url, key)


def test_killed_after_commit_inside_a_range_backfill_the_rerun_repairs_then_continues(
    env, instance
):
    url, script = env
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO ev SELECT g, 'v' || g, g FROM generate_series(21, 30) g")
    get_runtime().windows.plan(NAME, [Window(20, 30)])
    w3 = Window(20, 30).to_key()
    run_in_process(instance, [W1])
    # the range run skips W1, commits W2 and dies before recording it; W3 is never reached
    code, _, err = finish(run_child(script, [W1, W2, w3], fault="after_commit"))
    assert code == -signal.SIGKILL, err[-2000:]
    assert [w.state for w in get_runtime().windows.windows(NAME)] == [
        "applied",
        "applying",
        "planned",
    ]
    meta = run_in_process(instance, [W1, W2, w3])
    assert (meta["windows_skipped"], meta["windows_repaired"], meta["windows_applied"]) == (1, 1, 1)
    for key in (W1, W2, w3):
        assert_applied_exactly_once(url, key)
    assert_table_is_source_upto(url, 30)


# --- (c) after the ledger update: a normal success, then a retry -----------------------------


def test_success_then_retry_in_another_process_is_a_noop(env, instance):
    url, script = env
    meta = run_in_process(instance, [W1])
    assert meta["windows_applied"] == 1
    assert_applied_exactly_once(url, W1)
    before = [s.snapshot_id for s in get_runtime().iceberg.load(NAME).snapshots()]

    code, result, err = finish(run_child(script, [W1]))
    assert code == 0 and result is not None and result["success"], err[-2000:]
    assert result["meta"]["windows_skipped"] == 1
    assert "no-op" in result["meta"]["note"]
    meta = run_in_process(instance, [W1])
    assert meta["windows_skipped"] == 1
    assert [s.snapshot_id for s in get_runtime().iceberg.load(NAME).snapshots()] == before
    assert_applied_exactly_once(url, W1)
    assert_table_is_source_upto(url, 10)


# --- two runs of the same window at the same time ----------------------------------------------


def test_two_processes_racing_on_one_window_apply_it_once(env, tmp_path):
    url, script = env
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    slow = {"TEST_SLOW_COMPUTE_S": "1.0"}  # both are inside the run while the first applies
    procs = [run_child(script, [W1], barrier=barrier, extra_env=slow) for _ in range(2)]
    deadline = time.time() + 150
    while len(list(barrier.glob("ready-*"))) < 2:
        assert all(p.poll() is None for p in procs), [finish(p) for p in procs]
        assert time.time() < deadline, "children never reached the barrier"
        time.sleep(0.02)
    (barrier / "go").touch()
    outcomes = [finish(p) for p in procs]
    for code, result, err in outcomes:
        assert code == 0 and result is not None and result["success"], err[-2000:]
    applied = sorted(r["meta"]["windows_applied"] for _, r, _ in outcomes)  # type: ignore[index]
    skipped = sorted(r["meta"]["windows_skipped"] for _, r, _ in outcomes)  # type: ignore[index]
    assert applied == [0, 1] and skipped == [0, 1], outcomes
    assert_applied_exactly_once(url, W1)
    assert_table_is_source_upto(url, 10)
