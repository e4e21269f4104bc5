"""Table maintenance beside write-audit-publish (issue 15): an audit's publish fast-forwards main
to its branch, so compaction does not commit on main while an audit can still publish (it says
why), and snapshot expiry keeps the branch's history back to main (the publish checks that main
is an ancestor of the branch head). Real Postgres, a real catalog, a polars oracle."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec
from pipeline_output.errors import MaintenanceConflict
from pipeline_output.services.audit import publish_audit
from pipeline_output.services.publish import Publisher
from pipeline_output.stores.iceberg.maintenance.orphans import table_orphans
from pipeline_output_tests.iceberg_harness import customers
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.publishers import make_publisher, mode

SPEC = DatasetSpec(name="items", primary_key=("id",), strategy="snapshot_replace")


@pytest.fixture
def pub(pg_db_url: str, catalog: Any) -> Publisher:
    return make_publisher(pg_db_url, catalog)


def small_files(pub: Publisher, n: int) -> pl.DataFrame:
    """`n` writes of new keys: `n` small data files on main."""
    frames = [customers(range(k * 10, k * 10 + 10)) for k in range(n)]
    for k, frame in enumerate(frames):
        pub.publish(SPEC, frame, mode=mode("iceberg"), run_id=f"w{k}")
    return pl.concat(frames)


def test_compaction_waits_for_an_audit_that_can_still_publish(pub):
    rows = small_files(pub, 6)
    staged = customers([500])
    pub.publish(SPEC, staged, mode=mode("iceberg"), run_id="r1", audit=True)
    before = [s.snapshot_id for s in pub.iceberg.load(SPEC).snapshots()]

    skipped = pub.iceberg.compact(SPEC)

    assert skipped.noop and skipped.skipped and "audit-r1" in skipped.skipped
    assert [s.snapshot_id for s in pub.iceberg.load(SPEC).snapshots()] == before
    assert publish_audit(pub, SPEC, run_id="r1") is not None  # main did not move: it publishes
    done = pub.iceberg.compact(SPEC)
    assert done.files_rewritten == 7 and done.skipped is None
    assert_same_multiset(pub.iceberg.read(SPEC), pl.concat([rows, staged]))


def test_an_audit_staged_during_a_compaction_makes_it_stand_down(pub):
    rows = small_files(pub, 6)
    staged = customers([500])

    def audit_meanwhile(done: int, planned: int) -> None:
        pub.publish(SPEC, staged, mode=mode("iceberg"), run_id="r1", audit=True)

    with pytest.raises(MaintenanceConflict, match="audit"):
        pub.iceberg.compact(SPEC, progress=audit_meanwhile, max_attempts=1)

    assert table_orphans(pub.iceberg.load(SPEC), grace_s=0) == []  # its files are gone
    assert publish_audit(pub, SPEC, run_id="r1") is not None
    assert_same_multiset(pub.iceberg.read(SPEC), pl.concat([rows, staged]))


def test_expiry_keeps_an_audit_branchs_history_so_it_still_publishes(pub):
    rows = small_files(pub, 3)
    first, second = customers([500]), customers([501])
    for frame in (first, second):  # two staged writes: two snapshots on the branch
        pub.publish(SPEC, frame, mode=mode("iceberg"), run_id="r1", audit=True)

    result = pub.iceberg.expire_snapshots(SPEC, older_than=timedelta(0), ledger=None)

    assert result.snapshots_expired == 2  # main's older snapshots; the branch's two are kept
    assert publish_audit(pub, SPEC, run_id="r1") is not None
    assert_same_multiset(pub.iceberg.read(SPEC), pl.concat([rows, first, second]))
