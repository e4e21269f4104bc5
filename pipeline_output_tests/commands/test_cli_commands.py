"""The reference's other commands (`docs/reference.md`) as real processes on one database: demo
seed/tick, materialize, plan, windows, windows restate, doctor, maintain, status."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pipeline_output_tests.commands.cli_runner import Run, isolated_env, runner


@pytest.fixture
def cli(pg_db_url: str, tmp_path: Path) -> Run:
    return runner(env=isolated_env(tmp_path, pg_db_url), cwd=tmp_path)


def test_demo_plan_windows_restate_doctor_maintain_and_status_commands(cli, pg_db_url: str) -> None:
    seeded = cli("demo", "seed")
    assert seeded.returncode == 0, seeded.stderr
    assert "raw_customers=400" in seeded.stdout

    planned = cli("plan")
    assert planned.returncode == 0, planned.stderr
    assert (
        "active_products [iceberg, mode iceberg from declared]: replace (first deploy)"
        in planned.stdout
    )

    first = cli("materialize")
    assert first.returncode == 0, first.stderr
    assert "seeded it" not in first.stdout  # already seeded

    ticked = cli("demo", "tick")
    assert ticked.returncode == 0 and "tick: tick=1" in ticked.stdout, ticked.stderr
    replanned = cli("plan", "active_products", "customers")
    assert (
        "active_products [iceberg" in replanned.stdout and ": sync (re-deploy)" in replanned.stdout
    )
    assert "customers [iceberg" in replanned.stdout

    typo = cli("materialize", "custmers")  # a dataset named as `plan` names them: one line
    assert typo.returncode == 2 and "unknown dataset 'custmers'" in typo.stderr, typo.stderr
    assert "known datasets: active_products, customer_churn, customers," in typo.stderr
    second = cli("materialize", "customers")
    assert second.returncode == 0, second.stderr
    assert "upsert" in second.stdout and "1 window (400, 420]: 1 applied" in second.stdout

    listed = cli("windows", "customers")
    assert listed.returncode == 0, listed.stderr
    lines = [line for line in listed.stdout.splitlines() if "applied" in line]
    assert len(lines) == 2 and "GAP" not in listed.stdout
    header, *body = listed.stdout.splitlines()
    assert header.index("state") == body[0].index("applied"), "columns line up with the header"
    newest = cli("windows", "customers", "--limit", "1")
    assert newest.returncode == 0, newest.stderr
    assert "(400, 420]" in newest.stdout and "(-inf, 400]" not in newest.stdout
    assert "showing the newest 1 of 2 windows (2 applied)" in newest.stdout

    window = "00000000000000000400..00000000000000000420"
    restated = cli("windows", "restate", "customers", window)
    assert restated.returncode == 0, restated.stderr
    assert f"window 2 (400, 420] restated (partition {window}," in restated.stdout
    not_delta = cli("windows", "daily_revenue")
    assert not_delta.returncode == 2 and "customers" in not_delta.stderr

    doctor = cli("doctor", "--grace", "0")
    assert doctor.returncode == 0, doctor.stderr
    assert "no orphan data files" in doctor.stdout

    maintained = cli(
        "maintain", "--compact", "--expire", "0s", "--orphans", "--min-input-files", "2"
    )
    assert maintained.returncode == 0, maintained.stderr
    assert "customers: compact: rewrote" in maintained.stdout, maintained.stdout
    assert "customers: expire: expired 3 of 4 snapshot(s)" in maintained.stdout, maintained.stdout
    assert "customers: orphans: removed 0 file(s)" in maintained.stdout, maintained.stdout

    status = cli("status")
    assert status.returncode == 0, status.stderr
    for name in ("customers", "orders", "order_events", "daily_revenue", "active_products"):
        assert any(line.startswith(name) for line in status.stdout.splitlines()), status.stdout
    with psycopg.connect(pg_db_url) as conn:
        states = conn.execute(
            "SELECT state, count(*) FROM pipeline_output.windows WHERE dataset = 'customers' GROUP BY 1"
        ).fetchall()
    assert dict(states) == {"applied": 2}
