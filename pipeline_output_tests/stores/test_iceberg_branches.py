"""The native arm writes to branches and reads past versions (issue 15, the Iceberg side of
write-audit-publish and time travel): a branch write plans against the branch head and leaves
main — and every reader of it — untouched; main moves only by `move_main`, which asserts where
main pointed; `read(as_of=...)` reads a snapshot id or the time main pointed at it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.errors import InvalidArgument, WriteConflict
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.iceberg.table.tables import ancestor_ids, head, move_main
from pipeline_output_tests.oracle import assert_same_multiset

SPEC = DatasetSpec(name="items", primary_key=("id",), strategy="snapshot_replace")


def rows(ids: Any, *, version: int = 0) -> pl.DataFrame:
    ids = list(ids)
    return pl.DataFrame({"id": ids, "v": [i * 10 + version for i in ids]}).cast({"id": pl.Int64})


@pytest.fixture
def store(catalog: Any, pg_db_url: str) -> IcebergStore:
    return IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))


def test_a_branch_write_upserts_against_the_branch_head_and_leaves_main_untouched(store):
    main = store.write(SPEC, rows(range(1, 6)), run_id="r0").snapshot_id
    first = store.write(SPEC, rows([4, 5, 6], version=1), run_id="r1", branch="audit-r1")
    second = store.write(SPEC, rows([6, 7], version=2), run_id="r1", branch="audit-r1")

    table = store.load(SPEC)
    assert head(table) == main, "main must not move"
    assert head(table, "audit-r1") == second.snapshot_id
    assert table.snapshot_by_id(first.snapshot_id).parent_snapshot_id == main
    assert table.snapshot_by_id(second.snapshot_id).parent_snapshot_id == first.snapshot_id
    assert second.write_mode == "upsert" and (second.rows_inserted, second.rows_updated) == (1, 1)
    assert_same_multiset(store.read(SPEC), rows(range(1, 6)))
    expected = pl.concat([rows([1, 2, 3]), rows([4, 5], version=1), rows([6, 7], version=2)])
    assert_same_multiset(store.read(SPEC, as_of=second.snapshot_id), expected)
    summary = table.snapshot_by_id(second.snapshot_id).summary
    assert summary["pipeline-output.run-id"] == "r1"
    assert summary["pipeline-output.rows-updated"] == "1"


def test_a_first_deploy_to_a_branch_leaves_main_unset_and_is_still_a_first_deploy(store):
    result = store.write(SPEC, rows(range(1, 4)), run_id="r1", branch="audit-r1")
    assert result.first_deploy and result.write_mode == "replace"
    table = store.load(SPEC)
    assert head(table) is None and table.current_snapshot() is None
    assert store.read(SPEC).height == 0, "readers of main see no rows before the publish"
    assert store.target_state(SPEC).has_snapshot is False

    move_main(table, result.snapshot_id, expected=None, drop_branch="audit-r1")
    table = store.load(SPEC)
    assert head(table) == result.snapshot_id and "audit-r1" not in table.metadata.refs
    assert_same_multiset(store.read(SPEC), rows(range(1, 4)))


def test_moving_main_asserts_where_it_pointed_and_drops_the_branch_in_the_same_commit(store):
    base = store.write(SPEC, rows(range(1, 4)), run_id="r0").snapshot_id
    staged = store.write(SPEC, rows([9]), run_id="r1", branch="audit-r1").snapshot_id
    other = store.write(SPEC, rows([8]), run_id="r2").snapshot_id  # another writer moves main
    table = store.load(SPEC)
    with pytest.raises(WriteConflict, match="main points at"):
        move_main(table, staged, expected=base, drop_branch="audit-r1")
    assert head(store.load(SPEC)) == other and "audit-r1" in store.load(SPEC).metadata.refs

    stale = store.load(SPEC)
    store.write(SPEC, rows([7]), run_id="r3")  # main moves after `stale` was loaded
    with pytest.raises(WriteConflict, match="main moved"):
        move_main(stale, stale.snapshot_by_id(other).snapshot_id, expected=other)

    table = store.load(SPEC)
    versions = len(table.metadata.metadata_log)
    move_main(table, base, expected=head(table))
    after = store.load(SPEC)
    assert head(after) == base and len(after.metadata.metadata_log) == versions + 1


def test_read_as_of_a_snapshot_or_an_aware_time_and_a_naive_time_is_refused(store):
    first = store.write(SPEC, rows(range(1, 4)), run_id="r0").snapshot_id
    time.sleep(0.01)
    between = datetime.now(UTC)
    time.sleep(0.01)
    store.write(SPEC, rows([4]), run_id="r1")
    assert_same_multiset(store.read(SPEC, as_of=first), rows(range(1, 4)))
    assert_same_multiset(store.read(SPEC, as_of=between), rows(range(1, 4)))
    assert store.read(SPEC).height == 4
    with pytest.raises(InvalidArgument, match="no time zone"):
        store.read(SPEC, as_of=between.replace(tzinfo=None))
    with pytest.raises(InvalidArgument, match="no snapshot 12345"):
        store.read(SPEC, as_of=12345)
    with pytest.raises(InvalidArgument, match="no snapshot at"):
        store.read(SPEC, as_of=datetime(2000, 1, 1, tzinfo=UTC))


def test_an_attempt_marker_counts_only_in_mains_history(store):
    store.write(SPEC, rows(range(1, 4)), run_id="r0")
    staged = store.write(
        SPEC, rows([5]), run_id="r1", branch="audit-r1", summary={"window-attempt": "7:1"}
    ).snapshot_id
    assert store.find_marker(SPEC, "7:1") is None
    assert store.find_marker(SPEC, "7:1", ref="audit-r1") == staged
    table = store.load(SPEC)
    move_main(table, staged, expected=head(table))
    assert store.find_marker(SPEC, "7:1") == staged
    assert staged in ancestor_ids(store.load(SPEC), head(store.load(SPEC)))


def test_a_merge_on_read_branch_write_keeps_main_untouched_and_publishes_its_delete_files(store):
    spec = DatasetSpec(
        name="items",
        primary_key=("id",),
        strategy="snapshot_replace",
        write_strategy_hint="merge-on-read",
    )
    base = store.write(spec, rows(range(1, 21)), run_id="r0").snapshot_id
    staged = store.write(spec, rows([3, 30], version=1), run_id="r1", branch="audit-r1")
    table = store.load(spec)
    assert head(table) == base
    summary = table.snapshot_by_id(staged.snapshot_id).summary
    assert int(summary.get("added-position-deletes", "0")) >= 1, summary
    assert_same_multiset(store.read(spec), rows(range(1, 21)))
    move_main(table, staged.snapshot_id, expected=base, drop_branch="audit-r1")
    expected = pl.concat([rows([i for i in range(1, 21) if i != 3]), rows([3, 30], version=1)])
    assert_same_multiset(store.read(spec), expected)
