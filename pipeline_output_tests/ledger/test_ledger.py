"""The control plane on a real Postgres: migrations (idempotent, concurrent, append-only), deploys and
the freshness oracle, mode flips with history, parity results, divergence, the dataset registry.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import psycopg
import pyarrow as pa
import pytest

from pipeline_output import Window
from pipeline_output.contract.plan import WriteResult
from pipeline_output.ledger import Ledger, MigrationError, UnknownMode, migrations


@pytest.fixture
def ledger(pg_db_url: str) -> Ledger:
    led = Ledger(pg_db_url)
    led.migrate()
    return led


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'pipeline_output'"
        ).fetchall()
    return {r[0] for r in rows}


# --- migrations ------------------------------------------------------------------------------------


def test_migrate_applies_every_file_once_and_is_idempotent(pg_db_url):
    led = Ledger(pg_db_url)
    versions = [m.version for m in migrations.available()]
    assert versions == sorted(versions) and versions[:2] == [1, 2]
    assert led.applied_migrations() == []
    assert led.migrate() == versions
    assert led.migrate() == []
    assert Ledger(pg_db_url).migrate() == []
    assert led.applied_migrations() == versions
    assert {
        "schema_migrations",
        "datasets",
        "deploys",
        "mode_flips",
        "dataset_modes",
        "parity_results",
        "dataset_rows",
    } <= _tables(pg_db_url)


def test_concurrent_migrations_from_several_processes_are_safe(pg_db_url):
    code = (
        "import sys; from pipeline_output.ledger import Ledger; "
        "print(Ledger(sys.argv[1]).migrate())"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, pg_db_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    applied = [out.strip() for out, _ in outputs]
    expected = str([m.version for m in migrations.available()])
    assert sorted(applied) == sorted(["[]"] * 3 + [expected]), applied
    with psycopg.connect(pg_db_url) as conn:
        count = conn.execute("SELECT count(*) FROM pipeline_output.schema_migrations").fetchone()
    assert count is not None and count[0] == len(migrations.available())


def test_a_later_migration_file_is_applied_alone(pg_db_url, monkeypatch):
    led = Ledger(pg_db_url)
    led.migrate()
    shipped = migrations.available()
    later = migrations.Migration(
        shipped[-1].version + 1,
        "windows",
        "CREATE TABLE pipeline_output.windows_probe (dataset text, low text, high text);",
    )
    monkeypatch.setattr(migrations, "available", lambda: [*shipped, later])
    assert led.migrate() == [later.version]
    assert led.migrate() == []
    assert "windows_probe" in _tables(pg_db_url)


def test_an_edited_applied_migration_is_refused(pg_db_url, monkeypatch):
    led = Ledger(pg_db_url)
    led.migrate()
    shipped = migrations.available()
    edited = migrations.Migration(shipped[0].version, shipped[0].name, shipped[0].text + "\n-- x")
    monkeypatch.setattr(migrations, "available", lambda: [edited, *shipped[1:]])
    with pytest.raises(MigrationError, match="different content"):
        led.migrate()


def test_a_failing_migration_leaves_nothing_behind(pg_db_url, monkeypatch):
    led = Ledger(pg_db_url)
    broken = [*migrations.available(), migrations.Migration(99, "broken", "CREATE TABLE x (")]
    monkeypatch.setattr(migrations, "available", lambda: broken)
    with pytest.raises(MigrationError, match="099_broken"):
        led.migrate()
    assert led.applied_migrations() == []
    assert _tables(pg_db_url) == set()


# --- deploys and the freshness oracle ----------------------------------------------------------------


def test_deploys_and_the_freshness_oracle(ledger):
    assert ledger.deploy_log.last_deploy("ds", "pg") is None
    assert not ledger.deploy_log.has_succeeded_deploy("ds", "pg")
    failed = ledger.deploy_log.record_deploy("ds", "pg", status="failed", run_id="r0", error="boom")
    assert failed.status == "failed" and failed.error == "boom"
    assert not ledger.deploy_log.has_succeeded_deploy("ds", "pg")
    result = WriteResult(
        dataset="ds",
        write_mode="upsert",
        first_deploy=False,
        rows_in=5,
        rows_inserted=2,
        rows_updated=1,
        rows_unchanged=2,
        rows_total_after=9,
    )
    window = Window(low=10, high=20)
    started = datetime(2026, 1, 1, tzinfo=UTC)
    ok = ledger.deploy_log.record_deploy(
        "ds",
        "iceberg",
        status="succeeded",
        run_id="r1",
        strategy="snapshot_replace",
        window=window,
        result=result,
        snapshot_id=123456789012345,
        started_at=started,
    )
    assert (ok.write_mode, ok.rows_in, ok.rows_inserted, ok.rows_total_after) == ("upsert", 5, 2, 9)
    assert (ok.window, ok.window_key, ok.snapshot_id) == (
        str(window),
        window.to_key(),
        123456789012345,
    )
    assert ok.started_at == started and ok.finished_at >= started
    assert ledger.deploy_log.has_succeeded_deploy("ds", "iceberg")
    assert not ledger.deploy_log.has_succeeded_deploy("ds", "pg")
    assert ledger.deploy_log.last_deploy("ds", "iceberg") == ok
    assert [d.id for d in ledger.deploy_log.deploys("ds")] == [ok.id, failed.id]
    with pytest.raises(ValueError, match="arm"):
        ledger.deploy_log.record_deploy("ds", "duckdb", status="succeeded")
    with pytest.raises(ValueError, match="status"):
        ledger.deploy_log.record_deploy("ds", "pg", status="maybe")


def test_a_range_runs_writes_are_recorded_as_one_statement_a_no_op_not_at_all(ledger):
    # a range run's partitions share one commit; their records go in one INSERT (one round trip)
    from pipeline_output.contract.spec import DatasetSpec

    spec = DatasetSpec("daily", primary_key=("id",), strategy="replace")

    def part(rows: int, snapshot: int | None) -> WriteResult:
        return WriteResult(
            dataset="daily",
            write_mode="replace",
            first_deploy=False,
            rows_in=rows,
            rows_inserted=rows,
            rows_total_after=7,
            snapshot_id=snapshot,
        )

    written = [part(3, 11), part(0, None), part(4, 11)]
    assert ledger.deploy_log.record_writes(spec, written, run_id="r9") == 2
    got = ledger.deploy_log.deploys("daily")
    assert sorted((d.rows_in, d.snapshot_id, d.run_id, d.status) for d in got) == [
        (3, 11, "r9", "succeeded"),
        (4, 11, "r9", "succeeded"),
    ]
    assert {(d.strategy, d.write_mode, d.arm) for d in got} == {("replace", "replace", "iceberg")}
    assert ledger.deploy_log.record_writes(spec, [part(0, None)], run_id="r10") == 0


def test_divergence_is_recorded_as_a_deploy_and_a_failed_parity(ledger):
    record = ledger.record_divergence(
        "ds", run_id="r9", error="commit failed", snapshot_id=42, window="(1, 2]"
    )
    assert (record.arm, record.status, record.snapshot_id) == ("pg", "diverged", 42)
    assert not ledger.deploy_log.has_succeeded_deploy("ds", "pg")
    parity = ledger.parity_log.last_parity("ds")
    assert parity is not None and parity.passed is False
    assert parity.details["reason"] == "diverged" and parity.details["deploy_id"] == record.id


# --- flips ------------------------------------------------------------------------------------------


def test_flips_keep_history_and_survive_a_new_ledger(ledger, pg_db_url):
    assert ledger.flip_log.current_flip("orders") is None
    first = ledger.flip_log.flip("orders", "dual", who="alice", reason="canary")
    assert (first.from_mode, first.to_mode, first.who, first.reason) == (
        None,
        "dual",
        "alice",
        "canary",
    )
    second = ledger.flip_log.flip("orders", "iceberg", who="bob")
    assert (second.from_mode, second.to_mode) == ("dual", "iceberg")
    fresh = Ledger(pg_db_url)
    assert fresh.flip_log.current_flip("orders") == "iceberg"
    history = fresh.flip_log.flip_history("orders")
    assert [(f.from_mode, f.to_mode, f.who) for f in history] == [
        (None, "dual", "alice"),
        ("dual", "iceberg", "bob"),
    ]
    assert history[0].at <= history[1].at
    assert fresh.flip_log.flips() == {"orders": "iceberg"}
    assert fresh.flip_log.current_flip("other") is None
    assert "orders" in fresh.datasets()


def test_flip_to_an_unknown_mode_lists_the_valid_ones(ledger):
    with pytest.raises(UnknownMode, match="pg, iceberg, dual"):
        ledger.flip_log.flip("orders", "delta", who="alice")
    assert ledger.flip_log.flip_history("orders") == []
    with pytest.raises(ValueError, match="who"):
        ledger.flip_log.flip("orders", "pg", who="")


# --- parity and the registry --------------------------------------------------------------------------


def test_parity_results(ledger):
    assert ledger.parity_log.last_parity("ds") is None
    ledger.parity_log.record_parity("ds", passed=True, pg_count=3, iceberg_count=3, run_id="a")
    bad = ledger.parity_log.record_parity(
        "ds",
        passed=False,
        pg_count=3,
        iceberg_count=4,
        differing_keys={"only_in_iceberg": [{"id": 4}], "only_in_pg": []},
        run_id="b",
    )
    last = ledger.parity_log.last_parity("ds")
    assert last == bad
    assert last.differing_keys == {"only_in_iceberg": [{"id": 4}], "only_in_pg": []}
    assert (last.pg_count, last.iceberg_count, last.passed) == (3, 4, False)


def test_registry_round_trips_the_arrow_schema(ledger):
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("amount", pa.decimal128(12, 2)),
            ("name", pa.large_string()),
        ]
    )
    ledger.registry.register_dataset("ds", primary_key=("id",), arrow_schema=schema)
    entry = ledger.registry.registered("ds")
    assert entry is not None
    assert entry.primary_key == ("id",) and entry.arrow_schema.equals(schema)
    wider = schema.append(pa.field("extra", pa.bool_()))
    ledger.registry.register_dataset("ds", primary_key=("id",), arrow_schema=wider)
    assert ledger.registry.dataset_schema("ds").equals(wider)
    assert ledger.registry.dataset_schema("nope") is None


def test_an_up_to_date_schema_is_checked_in_one_read_without_the_migrations_lock(
    pg_db_url: str,
) -> None:
    from pipeline_output.infra import locks, pgsession

    with pgsession.connect(pg_db_url, autocommit=True) as conn:  # an empty database
        assert migrations.migrate(conn) == [m.version for m in migrations.available()]
    with pgsession.connect(pg_db_url) as holder, holder.transaction():
        locks.acquire(holder, locks.MIGRATIONS, transaction=True)  # another process migrating
        with pgsession.connect(pg_db_url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            assert migrations.migrate(conn) == []  # nothing pending: the lock is not waited for


def test_a_run_that_wrote_a_dataset_unaudited_has_no_audit_of_it_without_a_query(
    pg_db_url: str,
) -> None:
    from pipeline_output.ledger.connection import ControlPlaneDb
    from pipeline_output.ledger.control_plane import AuditLog, AuditWrite

    down = AuditLog(ControlPlaneDb("postgresql://postgres@/none?host=/nonexistent-po-socket"))
    down.note_unaudited("events", "r1")
    assert down.audit("events", "r1") is None  # answered without the database
    with pytest.raises(psycopg.OperationalError):
        down.audit("events", "r2")  # any other pair is looked up
    ledger = Ledger(pg_db_url)
    ledger.migrate()
    log = ledger.audit_log
    log.note_unaudited("events", "r1")
    staged = log.stage_write(
        "events",
        run_id="r1",
        branch="audit-r1",
        mode="iceberg",
        base_snapshot_id=None,
        write=AuditWrite(seq=1, snapshot_id=7, strategy="upsert"),
    )
    found = log.audit("events", "r1")  # a staged write forgets the note
    assert found is not None and found.id == staged.id and found.state == "staged"
