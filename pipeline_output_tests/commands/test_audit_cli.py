"""Write-audit-publish, history and rollback through the CLI, as real processes on a user's code
location (issue 15): an audited delta dataset whose blocking check fails leaves main and every
reader's view unchanged (`materialize` fails, `audit show` keeps the branch), a passing one
publishes exactly one snapshot; `rollback --before-run` takes the table back in one commit, the
rolled-back window goes back to planned, and the next `materialize` re-applies it without
planning any window twice — the final table equals the polars oracle."""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pytest

from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output_tests.commands.cli_runner import Run, isolated_env, runner
from pipeline_output_tests.oracle import assert_same_multiset

USER_DEFS = """
import dagster as dg
import polars as pl

from pipeline_output import Delta, build_definitions, dataset, postgres_source

events_raw = postgres_source("events_raw", table="events", schema="public", watermark="seq")


@dataset(primary_key="id", mode="iceberg", audit=True,
         delta=Delta(source="events_raw", watermark="seq"))
def events(events_raw: pl.LazyFrame) -> pl.LazyFrame:
    return events_raw.select("id", "seq", "amount")


@dg.asset_check(asset="events", blocking=True)
def no_negative_amounts(events: pl.LazyFrame) -> dg.AssetCheckResult:
    bad = events.filter(pl.col("amount") < 0).select(pl.len()).collect().item()
    return dg.AssetCheckResult(passed=bad == 0, metadata={"negative": bad})


defs = build_definitions(datasets=[events], sources=[events_raw], asset_checks=[no_negative_amounts])
"""


@pytest.fixture
def project(tmp_path: Path, pg_db_url: str) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "defs.py").write_text(USER_DEFS)
    with psycopg.connect(pg_db_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.events (id bigint PRIMARY KEY, seq bigint NOT NULL, "
            "amount bigint NOT NULL)"
        )
    return root


@pytest.fixture
def cli(tmp_path: Path, pg_db_url: str, project: Path) -> Run:
    run = runner(env=isolated_env(tmp_path, pg_db_url), cwd=project)

    def with_location(*args: str) -> subprocess.CompletedProcess[str]:
        return run(*args, "-f", "defs.py")

    return with_location


def insert(url: str, rows: list[tuple[int, int, int]]) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO public.events VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
            "SET seq = EXCLUDED.seq, amount = EXCLUDED.amount",
            rows,
        )


def source(url: str) -> pl.DataFrame:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, seq, amount FROM public.events").fetchall()
    return pl.DataFrame(rows, schema=["id", "seq", "amount"], orient="row")


def table(tmp_path: Path, url: str) -> tuple[pl.DataFrame, int | None]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        "default",
        uri=to_sqlalchemy_url(url, driver="psycopg"),
        warehouse=f"file://{tmp_path}/home/warehouse",
    )
    try:
        loaded = catalog.load_table("datasets.events")
        frame = pl.from_arrow(loaded.scan().to_arrow())
        snapshot = loaded.current_snapshot()
    finally:
        catalog.engine.dispose()
    assert isinstance(frame, pl.DataFrame)
    return frame, snapshot.snapshot_id if snapshot is not None else None


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def windows(url: str) -> list[tuple[str, str, int]]:
    with psycopg.connect(url) as conn:
        rows: list[Any] = conn.execute(
            "SELECT partition_key, state, attempts FROM pipeline_output.windows "
            "WHERE dataset = 'events' ORDER BY seq"
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def test_audit_fail_publish_history_and_rollback_of_a_delta_dataset_through_the_cli(
    cli, tmp_path, pg_db_url
):
    insert(pg_db_url, [(i, i, i * 10) for i in range(1, 6)])
    ok(cli("materialize"))
    first, main_1 = table(tmp_path, pg_db_url)
    assert_same_multiset(first, source(pg_db_url))

    # a window whose rows fail the blocking check: nothing readers see changes
    insert(pg_db_url, [(6, 6, 60), (7, 7, -1), (8, 8, 80)])
    failed = cli("materialize")
    assert failed.returncode != 0, failed.stdout
    assert "no_negative_amounts" in failed.stderr + failed.stdout
    after_fail, main_after_fail = table(tmp_path, pg_db_url)
    assert main_after_fail == main_1
    assert_same_multiset(after_fail, first)
    shown = ok(cli("audit", "show", "events"))
    assert re.search(r"failed\s+audit-\S+\s", shown), shown
    assert "no_negative_amounts" in shown and "(gone)" not in shown.splitlines()[1]

    # the source is fixed: the failed window is re-requested, audited and published
    insert(pg_db_url, [(7, 7, 70)])
    ok(cli("materialize"))
    second, main_2 = table(tmp_path, pg_db_url)
    at_2 = datetime.now(UTC).isoformat()  # main points at main_2 until the next materialize
    assert_same_multiset(second, source(pg_db_url))
    assert [state for _, state, _ in windows(pg_db_url)] == ["applied", "applied"]

    insert(pg_db_url, [(9, 9, 90), (10, 10, 100)])
    ok(cli("materialize"))
    history = ok(cli("history", "events"))
    lines = [line for line in history.splitlines()[1:] if line and line[0].isdigit()]
    assert len(lines) == 3 and lines[0].split()[1] == "*", history
    assert lines[0].split()[-4:] == ["2", "0", "0", "10"], history  # +2 ~0 -0, 10 rows
    run_3 = lines[0].split()[4]

    # roll the last window back: one commit, recorded, the window planned again
    rolled = ok(cli("rollback", "events", "--before-run", run_3, "--reason", "bad load"))
    assert f"-> {main_2}" in rolled and "1 window(s) back to planned" in rolled
    back, main_back = table(tmp_path, pg_db_url)
    assert main_back == main_2
    assert_same_multiset(back, second)
    planned = windows(pg_db_url)
    assert [state for _, state, _ in planned] == ["applied", "applied", "planned"]

    # the next materialize re-applies it, planning no window twice
    ok(cli("materialize"))
    final, table_main = table(tmp_path, pg_db_url)
    assert_same_multiset(final, source(pg_db_url))
    again = windows(pg_db_url)
    assert [k for k, _, _ in again] == [k for k, _, _ in planned], "no window planned twice"
    assert [state for _, state, _ in again] == ["applied"] * 3
    with psycopg.connect(pg_db_url) as conn:
        who, reason = conn.execute(
            "SELECT who, reason FROM pipeline_output.rollbacks WHERE dataset = 'events'"
        ).fetchone()  # type: ignore[misc]
    assert reason == "bad load" and who

    # expiry removes main_2; rolling back to a time when main pointed at it is refused, naming
    # the dataset and the earliest time that can be answered — never another version (issue 30)
    ok(cli("maintain", "events", "--expire", "0s"))
    gone = cli("rollback", "events", "--to-time", at_2)
    assert gone.returncode == 2 and "dataset 'events': --to-time" in gone.stderr, gone.stderr
    assert "earliest time that can be answered" in gone.stderr
    assert table(tmp_path, pg_db_url)[1] == table_main, "nothing moved"


def test_rollback_refuses_without_exactly_one_target_and_for_a_snapshot_not_on_main(cli, pg_db_url):
    insert(pg_db_url, [(1, 1, 10)])
    ok(cli("materialize"))
    both = cli("rollback", "events", "--to", "1", "--before-run", "x")
    assert both.returncode == 2 and "exactly one" in both.stderr
    unknown = cli("rollback", "events", "--to", "12345")
    assert unknown.returncode == 2 and "not in main's history" in unknown.stderr
    naive = cli("rollback", "events", "--to-time", "2026-01-01T00:00:00")
    assert naive.returncode == 2 and "dataset 'events': --to-time" in naive.stderr
    assert "time zone" in naive.stderr
