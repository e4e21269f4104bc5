"""Rollback and time travel (issue 15): `rollback` moves main back in one commit and records
who/when/why; it is refused where it would break the canary; `history` lists main's snapshots
with their run, strategy, write mode and row counters; a downstream asset reads an upstream as it
was (`as_of` asset config: a snapshot id or an aware time) for a reproducible re-run."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import polars as pl
import pytest

from pipeline_output import DatasetSpec, history, rollback
from pipeline_output.errors import InvalidArgument, RollbackRefused, SnapshotExpired
from pipeline_output.services.canary import check_parity, drain, flip
from pipeline_output.services.publish import Publisher
from pipeline_output.services.time_travel import parse_as_of
from pipeline_output.stores.iceberg.table.tables import head
from pipeline_output_tests.dagster_runs import failure_errors, run_assets
from pipeline_output_tests.iceberg_harness import customers
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.publishers import make_publisher, mode

SPEC = DatasetSpec(name="items", primary_key=("id",), strategy="snapshot_replace")


@pytest.fixture
def pub(pg_db_url: str, catalog: Any) -> Publisher:
    return make_publisher(pg_db_url, catalog)


def write(pub: Publisher, rows: pl.DataFrame, run_id: str, spec: DatasetSpec = SPEC) -> int:
    result = pub.publish(spec, rows, mode=mode("iceberg"), run_id=run_id)
    snapshot = result.primary.snapshot_id
    assert snapshot is not None
    return snapshot


def main_of(pub: Publisher, spec: DatasetSpec = SPEC) -> int | None:
    return head(pub.iceberg.load(spec))


def test_rollback_moves_main_back_in_one_commit_and_records_who_when_why(pub):
    s1 = write(pub, customers(range(1, 6)), "r1")
    time.sleep(0.01)
    between = datetime.now(UTC)
    time.sleep(0.01)
    s2 = write(pub, customers(range(4, 9), version=1), "r2")
    s3 = write(pub, customers([20]), "r3")
    versions = len(pub.iceberg.load(SPEC).metadata.metadata_log)

    record = rollback(pub, SPEC, before_run="r3", reason="bad load", who="alice")
    assert (record.from_snapshot_id, record.to_snapshot_id) == (s3, s2)
    assert len(pub.iceberg.load(SPEC).metadata.metadata_log) == versions + 1, "one commit"
    assert main_of(pub) == s2 and 20 not in pub.iceberg.read(SPEC)["id"].to_list()
    [recorded] = pub.ledger.rollback_log.rollbacks("items")
    assert (recorded.who, recorded.reason, recorded.to_snapshot_id) == ("alice", "bad load", s2)

    rollback(pub, SPEC, to_time=between, reason="to the first load")
    assert main_of(pub) == s1
    assert_same_multiset(pub.iceberg.read(SPEC), customers(range(1, 6)))
    with pytest.raises(RollbackRefused, match="not in main's history"):
        rollback(pub, SPEC, to_snapshot=s3)  # rolled back off main: not an ancestor any more
    with pytest.raises(RollbackRefused, match="already points"):
        rollback(pub, SPEC, to_snapshot=s1)
    with pytest.raises(RollbackRefused, match="first snapshot"):
        rollback(pub, SPEC, before_run="r1")
    with pytest.raises(InvalidArgument, match="exactly one"):
        rollback(pub, SPEC, to_snapshot=s1, before_run="r1")


def test_rollback_is_refused_for_a_dual_dataset_and_past_a_drain_of_the_legacy_arm(pub):
    specs = {"items": SPEC}
    flip(pub, specs, "items", "dual", who="t")
    pub.publish(SPEC, customers(range(1, 6)), mode=pub.resolve(SPEC), run_id="r1")
    first = main_of(pub)
    pub.publish(SPEC, customers(range(6, 9)), mode=pub.resolve(SPEC), run_id="r2")
    with pytest.raises(RollbackRefused, match="dual"):
        rollback(pub, SPEC, to_snapshot=first)
    assert check_parity(pub, SPEC).passed
    flip(pub, specs, "items", "iceberg", who="t")
    drain(pub, SPEC)
    with pytest.raises(RollbackRefused, match="drained"):
        rollback(pub, SPEC, to_snapshot=first)
    assert main_of(pub) != first


def test_history_lists_mains_snapshots_newest_first_with_runs_and_row_counters(pub):
    write(pub, customers(range(1, 6)), "r1")
    write(pub, customers(range(4, 9), version=1), "r2")
    rows = history(pub.iceberg, SPEC)
    assert [r.run_id for r in rows] == ["r2", "r1"] and rows[0].current
    assert (rows[0].write_mode, rows[0].inserted, rows[0].updated, rows[0].deleted) == (
        "upsert",
        3,
        2,
        0,
    )
    assert (rows[1].write_mode, rows[1].inserted, rows[1].total) == ("replace", 5, 5)
    assert rows[0].strategy == "snapshot_replace" and rows[0].committed_at.tzinfo is not None


def test_history_totals_the_live_rows_after_a_merge_on_read_upsert(pub):
    """A merge-on-read upsert keeps the replaced rows in their data file and removes them by
    position: Iceberg's `total-records` still counts them. The history's total is the table's
    rows, as `status` and a read count them."""
    spec = DatasetSpec(
        name="mor",
        primary_key=("id",),
        strategy="snapshot_replace",
        write_strategy_hint="merge-on-read",
    )
    base, change = customers(range(1, 101)), customers([*range(1, 101, 10), 200, 201], version=1)
    write(pub, base, "r1", spec)
    write(pub, change, "r2", spec)
    expected = pl.concat([base.join(change, on="id", how="anti"), change])
    rows = history(pub.iceberg, spec)
    assert (rows[0].updated, rows[0].inserted) == (10, 2)
    assert [r.total for r in rows] == [expected.height, 100]
    assert_same_multiset(pub.iceberg.read(spec), expected)


def test_parse_as_of_takes_snapshot_ids_and_aware_times_and_refuses_naive_ones():
    assert parse_as_of("123") == 123
    assert parse_as_of("2026-12-01T09:30:00Z") == datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    with pytest.raises(InvalidArgument, match="time zone"):
        parse_as_of("2026-12-01T09:30:00")
    with pytest.raises(InvalidArgument, match=r"dataset 'items': as_of .* has no time zone"):
        parse_as_of("2026-12-01T09:30:00", dataset="items")
    with pytest.raises(InvalidArgument, match="neither"):
        parse_as_of("yesterday")


# --- time travel across snapshot expiry (issue 30, items 1 and 6) --------------------------------


def tick() -> datetime:
    """A time strictly between the commits before and after it (snapshot-log times are in ms)."""
    time.sleep(0.01)
    moment = datetime.now(UTC)
    time.sleep(0.01)
    return moment


def tag_by_another_tool(pub: Publisher, snapshot_id: int, name: str = "kept") -> None:
    """What another engine does: a tag on an old snapshot, so expiry keeps it."""
    pub.iceberg.load(SPEC).manage_snapshots().create_tag(snapshot_id, name).commit()


def log_time(pub: Publisher, snapshot_id: int) -> str:
    """The (last) time main started pointing at `snapshot_id`, as the error names it."""
    entries = pub.iceberg.load(SPEC).metadata.snapshot_log
    millis = [e.timestamp_ms for e in entries if e.snapshot_id == snapshot_id][-1]
    return datetime.fromtimestamp(millis / 1000, tz=UTC).isoformat(timespec="milliseconds")


def test_as_of_a_time_whose_snapshot_expired_is_refused_never_answered_with_another_version(pub):
    """S1, S2, S3 on main, another tool tags S1, expiry removes S2: a time when main pointed at S2
    is refused (before: S1's rows), naming the dataset and the earliest answerable time."""
    first = customers(range(1, 6))
    s1 = write(pub, first, "r1")
    at_s1 = tick()
    write(pub, customers(range(4, 9), version=1), "r2")
    at_s2 = tick()
    s3 = write(pub, customers([20]), "r3")
    at_s3 = tick()
    now = pub.iceberg.read(SPEC)
    tag_by_another_tool(pub, s1)
    result = pub.iceberg.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    assert result.snapshots_expired == 1  # S2; S1 kept for the tag

    earliest = log_time(pub, s3)
    for moment in (at_s2, at_s1):  # S1's time lies before the first gap: refused too
        with pytest.raises(SnapshotExpired, match=f"dataset 'items'.*{re.escape(earliest)}"):
            pub.iceberg.read(SPEC, as_of=moment)
        with pytest.raises(SnapshotExpired, match="dataset 'items'"):
            pub.scan(SPEC, mode=mode("iceberg"), as_of=moment)
    assert_same_multiset(pub.iceberg.read(SPEC, as_of=at_s3), now)
    assert_same_multiset(pub.iceberg.read(SPEC, as_of=datetime.fromisoformat(earliest)), now)
    assert_same_multiset(pub.iceberg.read(SPEC, as_of=s1), first)  # the tag still reads
    with pytest.raises(InvalidArgument, match=r"dataset 'items'.*keeps no history"):
        pub.scan(SPEC, mode=mode("pg"), as_of=at_s3)  # the legacy arm: no time travel at all


def test_rollback_to_a_time_whose_snapshot_expired_is_refused_and_moves_nothing(pub):
    """S1, S2, rollback to S1, S3 (a child of S1); S1 tagged, S2 expired: rolling back to a time
    when main pointed at S2 is refused (before: main went to S1, a version it never had then)."""
    s1 = write(pub, customers(range(1, 6)), "r1")
    write(pub, customers(range(4, 9), version=1), "r2")
    at_s2 = tick()
    rollback(pub, SPEC, to_snapshot=s1, reason="bad load")
    at_s1_again = tick()
    s3 = write(pub, customers([20]), "r3")
    tag_by_another_tool(pub, s1)
    pub.iceberg.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)

    with pytest.raises(SnapshotExpired, match=f"'items'.*{re.escape(log_time(pub, s1))}"):
        rollback(pub, SPEC, to_time=at_s2, reason="to S2's time")
    assert main_of(pub) == s3 and len(pub.ledger.rollback_log.rollbacks("items")) == 1
    rollback(pub, SPEC, to_time=at_s1_again, reason="answerable: after the gap")
    assert main_of(pub) == s1


def test_a_lazy_read_pinned_to_a_snapshot_expiry_removed_names_dataset_and_snapshot(pub):
    """A LazyFrame (a downstream input) pinned to S1, collected after expiry removed S1 and its
    files: a project error naming the dataset and the snapshot (before: a raw FileNotFoundError)."""
    s1 = write(pub, customers(range(1, 6)), "r1")
    pinned = pub.scan(SPEC, mode=mode("iceberg"))
    by_id = pub.scan(SPEC, mode=mode("iceberg"), as_of=s1)
    write(pub, customers(range(6, 9)), "r2")
    pub.iceberg.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    for frame in (pinned, by_id):
        with pytest.raises(SnapshotExpired, match=f"dataset 'items'.*snapshot {s1}"):
            frame.collect()
        with pytest.raises(SnapshotExpired, match=f"snapshot {s1}"):
            frame.select(pl.len()).collect()


# --- as_of in Dagster: a reproducible re-run of a downstream asset -------------------------------

UP: dict[str, pl.DataFrame] = {}


def two_step_defs() -> dg.Definitions:
    from pipeline_output.dagster_layer.build import build_definitions
    from pipeline_output.dagster_layer.dataset import dataset

    @dataset("up", primary_key="id", mode="iceberg")
    def up() -> pl.DataFrame:
        return UP["up"]

    @dataset("down", primary_key="id", strategy="replace", mode="iceberg")
    def down(up: pl.LazyFrame) -> pl.LazyFrame:
        return up.select("id", "name")

    return build_definitions(datasets=[up, down])


def test_asset_config_as_of_reads_the_upstream_as_it_was(runtime_env):
    from pipeline_output.dagster_layer.resource import get_runtime

    defs = two_step_defs()
    instance = dg.DagsterInstance.ephemeral()
    UP["up"] = customers(range(1, 4))
    run_assets(defs, instance, ["up"])
    first = head(get_runtime().iceberg.load("up"))
    time.sleep(0.01)
    between = datetime.now(UTC).isoformat()
    time.sleep(0.01)
    UP["up"] = customers(range(3, 7), version=1)
    run_assets(defs, instance, ["up"])

    def down_names(as_of: str) -> list[str]:
        config = {"ops": {"down": {"config": {"as_of": as_of}}}}
        assert run_assets(defs, instance, ["down"], run_config=config).success
        return sorted(get_runtime().iceberg.read("down")["name"].to_list())

    assert down_names(str(first)) == sorted(f"c{i}-v0" for i in range(1, 4))
    assert down_names(between) == sorted(f"c{i}-v0" for i in range(1, 4))
    assert run_assets(defs, instance, ["down"]).success
    now = sorted(get_runtime().iceberg.read("down")["name"].to_list())
    assert now == ["c1-v0", "c2-v0", "c3-v1", "c4-v1", "c5-v1", "c6-v1"]
    naive = {"ops": {"down": {"config": {"as_of": "2026-01-01T00:00:00"}}}}
    bad = run_assets(defs, instance, ["down"], run_config=naive, raise_on_error=False)
    assert not bad.success and "dataset 'up': as_of '2026-01-01T00:00:00'" in failure(bad)

    # a third version of up, its first tagged by another tool, the second expired: `between`
    # lies before the first gap of main's log: refused, naming up and the earliest answerable time
    UP["up"] = customers([9], version=2)
    run_assets(defs, instance, ["up"])
    table = get_runtime().iceberg.load("up")
    table.manage_snapshots().create_tag(first, "kept").commit()
    get_runtime().iceberg.expire_snapshots(up_spec(), older_than=timedelta(0), retain_last=1)
    config = {"ops": {"down": {"config": {"as_of": between}}}}
    gone = run_assets(defs, instance, ["down"], run_config=config, raise_on_error=False)
    assert not gone.success
    assert failure_errors(gone) == ["SnapshotExpired"] and "dataset 'up'" in failure(gone)
    assert "earliest time that can be answered" in failure(gone)


def up_spec() -> DatasetSpec:
    return DatasetSpec(name="up", primary_key=("id",))


def failure(result: dg.ExecuteInProcessResult) -> str:
    """The step failures of a run, with their causes."""
    return " ".join(
        e.event_specific_data.error.to_string()  # type: ignore[union-attr]
        for e in result.all_events
        if e.is_step_failure
    )
