"""Write-audit-publish in the core (issue 15), without Dagster: an audited write is staged on the
run's branch and changes nothing any reader sees — main, the legacy arm, the deploy log, the
window ledger — until `publish_audit` fast-forwards main in one commit; a failed audit keeps the
branch and changes nothing; a publish never lands over another writer's. Real Postgres, a real
catalog, a polars oracle for contents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.errors import AuditConflict, AuditFailed, InvalidArgument
from pipeline_output.ledger.window_ledger import WindowLedger
from pipeline_output.services.audit import (
    audit_parity,
    drop_stale_audit_branches,
    fail_audit,
    publish_audit,
)
from pipeline_output.services.publish import Publisher
from pipeline_output.services.window_apply import ApplyRequest, apply_window
from pipeline_output.stores.iceberg.table.tables import head
from pipeline_output_tests.iceberg_harness import customers
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.publishers import corrupt_pg_row, make_publisher, mode, pg_docs

# Every test on the SQL catalog and on SeaweedFS's REST catalog over S3 (branches, fast-forward
# publishes and ref removals through REST commit requirements); the default run keeps the REST
# variant of the two marked `rest_default`.
pytestmark = pytest.mark.both_catalogs

SPEC = DatasetSpec(name="items", primary_key=("id",), strategy="snapshot_replace")


@pytest.fixture
def pub(pg_db_url: str, catalog: Any) -> Publisher:
    return make_publisher(pg_db_url, catalog)


def main_of(pub: Publisher, spec: DatasetSpec = SPEC) -> int | None:
    table = pub.iceberg.load(spec)
    return head(table) if table is not None else None


def upsert_oracle(before: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    return pl.concat([before.join(rows, on="id", how="anti"), rows])


@pytest.mark.rest_default
def test_an_audited_write_changes_nothing_readers_see_until_it_is_published(pub):
    pub.publish(SPEC, customers(range(1, 11)), mode=mode("iceberg"), run_id="r0")
    before_main, before_rows = main_of(pub), pub.iceberg.read(SPEC)
    deploys = len(pub.ledger.deploy_log.deploys("items", arm="iceberg"))
    update = customers(range(8, 14), version=1)

    staged = pub.publish(SPEC, update, mode=mode("iceberg"), run_id="r1", audit=True)
    assert staged.staged and staged.audit.branch == "audit-r1"
    assert main_of(pub) == before_main
    assert_same_multiset(pub.iceberg.read(SPEC), before_rows)
    assert len(pub.ledger.deploy_log.deploys("items", arm="iceberg")) == deploys, (
        "no deploy before publish"
    )
    snapshot = staged.results["iceberg"].snapshot_id
    assert_same_multiset(pub.iceberg.read(SPEC, as_of=snapshot), upsert_oracle(before_rows, update))

    done = publish_audit(pub, SPEC, run_id="r1")
    table = pub.iceberg.load(SPEC)
    assert done.moved and head(table) == snapshot
    assert table.snapshot_by_id(snapshot).parent_snapshot_id == before_main, "one new snapshot"
    assert "audit-r1" not in table.metadata.refs, "the branch is dropped in the publish commit"
    assert_same_multiset(pub.iceberg.read(SPEC), upsert_oracle(before_rows, update))
    assert pub.ledger.audit_log.audit("items", "r1").state == "published"
    newest = pub.ledger.deploy_log.deploys("items", arm="iceberg")[0]  # newest first
    assert newest.snapshot_id == snapshot and newest.run_id == "r1"
    again = publish_audit(pub, SPEC, run_id="r1")
    assert not again.moved and main_of(pub) == snapshot


def test_a_failed_audit_keeps_main_and_the_branch_and_maintenance_drops_it_later(pub):
    pub.publish(SPEC, customers(range(1, 6)), mode=mode("iceberg"), run_id="r0")
    before = main_of(pub)
    pub.publish(SPEC, customers([99]), mode=mode("iceberg"), run_id="r1", audit=True)
    assert fail_audit(pub, "items", run_id="r1", reason="check row_count failed")
    assert main_of(pub) == before and "audit-r1" in pub.iceberg.load(SPEC).metadata.refs
    with pytest.raises(AuditFailed, match="row_count"):
        publish_audit(pub, SPEC, run_id="r1")
    assert main_of(pub) == before

    assert drop_stale_audit_branches(pub) == [], "kept within the retention period"
    later = datetime.now(UTC) + timedelta(days=8)
    [dropped] = drop_stale_audit_branches(pub, now=later)
    assert dropped.run_id == "r1" and pub.ledger.audit_log.audit("items", "r1").state == "dropped"
    assert "audit-r1" not in pub.iceberg.load(SPEC).metadata.refs
    assert main_of(pub) == before


def test_an_audit_never_publishes_over_a_writer_that_moved_main_after_it_branched(pub):
    pub.publish(SPEC, customers(range(1, 6)), mode=mode("iceberg"), run_id="r0")
    pub.publish(SPEC, customers([6]), mode=mode("iceberg"), run_id="a", audit=True)
    pub.publish(SPEC, customers([7]), mode=mode("iceberg"), run_id="b", audit=True)
    publish_audit(pub, SPEC, run_id="a")
    winner = main_of(pub)
    with pytest.raises(AuditConflict, match="main moved"):
        publish_audit(pub, SPEC, run_id="b")
    assert main_of(pub) == winner
    assert pub.ledger.audit_log.audit("items", "b").state == "failed"
    assert "audit-b" in pub.iceberg.load(SPEC).metadata.refs
    assert sorted(pub.iceberg.read(SPEC)["id"].to_list()) == [1, 2, 3, 4, 5, 6]


def test_an_audited_first_deploy_creates_the_table_without_a_main_snapshot(pub):
    staged = pub.publish(
        SPEC, customers(range(1, 4)), mode=mode("iceberg"), run_id="r1", audit=True
    )
    assert staged.results["iceberg"].first_deploy
    assert main_of(pub) is None and pub.iceberg.read(SPEC).height == 0
    publish_audit(pub, SPEC, run_id="r1")
    assert_same_multiset(pub.iceberg.read(SPEC), customers(range(1, 4)))


def test_an_audited_write_needs_a_run_id(pub):
    with pytest.raises(InvalidArgument, match="run id"):
        pub.publish(SPEC, customers([1]), mode=mode("iceberg"), audit=True)


def test_a_dual_audit_writes_the_legacy_arm_only_after_main_moved(pub, pg_db_url):
    dual = DatasetSpec(name="both", primary_key=("id",), strategy="snapshot_replace")
    pub.publish(dual, customers(range(1, 11)), mode=mode("dual"), run_id="r0")
    legacy_before = pg_docs(pg_db_url, "both")
    update = customers(range(5, 15), version=1)
    pub.publish(dual, update, mode=mode("dual"), run_id="r1", audit=True)
    assert pg_docs(pg_db_url, "both") == legacy_before, "the legacy arm waits for the publish"
    report = audit_parity(pub, dual, run_id="r1")
    assert report is not None and report.passed, report.summary()
    assert pg_docs(pg_db_url, "both") == legacy_before, "the check's replay was rolled back"

    done = publish_audit(pub, dual, run_id="r1")
    expected = upsert_oracle(customers(range(1, 11)), update)
    assert done.moved and len(done.legacy) == 1
    assert_same_multiset(pub.postgres.read(dual), expected)
    assert_same_multiset(pub.iceberg.read(dual), expected)


def test_a_dual_audit_with_a_parity_mismatch_leaves_main_and_the_legacy_arm_unchanged(
    pub, pg_db_url
):
    dual = DatasetSpec(name="both", primary_key=("id",), strategy="snapshot_replace")
    pub.publish(dual, customers(range(1, 11)), mode=mode("dual"), run_id="r0")
    corrupt_pg_row(pg_db_url, "both", "3", "name", "tampered")  # 3 is preserved by the upsert
    legacy_before, main_before = pg_docs(pg_db_url, "both"), main_of(pub, dual)
    pub.publish(
        dual, customers(range(8, 14), version=1), mode=mode("dual"), run_id="r1", audit=True
    )
    report = audit_parity(pub, dual, run_id="r1")
    assert report is not None and not report.passed and report.only_in_pg == [3]
    with pytest.raises(AuditFailed, match="parity"):
        publish_audit(pub, dual, run_id="r1")
    assert main_of(pub, dual) == main_before and pg_docs(pg_db_url, "both") == legacy_before
    assert pub.ledger.audit_log.audit("both", "r1").state == "failed"
    assert "audit-r1" in pub.iceberg.load(dual).metadata.refs


@pytest.mark.rest_default
def test_audited_windows_are_staged_and_applied_only_when_published(pub, pg_db_url):
    spec = DatasetSpec(
        name="events",
        primary_key=("id",),
        strategy="snapshot_replace",
        delta=Delta(source="raw", watermark="seq"),
    )
    windows = WindowLedger(pg_db_url)
    w1, w2 = Window(low=None, high=10), Window(low=10, high=20)
    windows.plan("events", [w1, w2])
    for window, ids in ((w1, range(1, 11)), (w2, range(11, 21))):
        outcome = apply_window(
            ApplyRequest(
                spec=spec,
                window=window,
                compute=lambda ids=ids: customers(ids),
                mode=mode("iceberg"),
                run_id="r1",
                audit=True,
            ),
            publisher=pub,
            ledger=windows,
        )
        assert outcome.action == "staged"
    assert [w.state for w in windows.windows("events")] == ["staged", "staged"]
    assert main_of(pub, spec) is None
    again = apply_window(
        ApplyRequest(
            spec=spec,
            window=w1,
            compute=lambda: customers(range(1, 11)),
            mode=mode("iceberg"),
            run_id="r1",
            audit=True,
        ),
        publisher=pub,
        ledger=windows,
    )
    assert again.action == "skipped", "a window already staged by this run is not written twice"

    done = publish_audit(pub, spec, run_id="r1", windows=windows)
    assert done.windows == 2
    rows = windows.windows("events")
    assert [w.state for w in rows] == ["applied", "applied"]
    assert rows[1].iceberg_snapshot_id == main_of(pub, spec)
    assert_same_multiset(pub.iceberg.read(spec), customers(range(1, 21)))


def test_a_failed_audit_fails_its_staged_windows_so_the_sensor_requests_them_again(pub, pg_db_url):
    spec = DatasetSpec(
        name="events", primary_key=("id",), delta=Delta(source="raw", watermark="seq")
    )
    windows = WindowLedger(pg_db_url)
    windows.plan("events", [Window(low=None, high=10)])
    apply_window(
        ApplyRequest(
            spec=spec,
            window=Window(low=None, high=10),
            compute=lambda: customers(range(1, 11)),
            mode=mode("iceberg"),
            run_id="r1",
            audit=True,
        ),
        publisher=pub,
        ledger=windows,
    )
    fail_audit(pub, "events", run_id="r1", reason="check failed", windows=windows)
    [row] = windows.pending("events")
    assert row.state == "failed" and "check failed" in (row.error or "")
