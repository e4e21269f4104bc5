"""The vectorised merge (`write/key_scan.py`, `write/merge.py`) against the file-by-file one
and the oracle: upserts, syncs (also of a Dagster partition's slice) and append_new spread over
several data files, with merge-on-read and copy-on-write, keys matched in every file, rows changed
in one column only (the last one the column-by-column comparison reads), identical rows, NaN and
nulls, composite keys, files already carrying delete files, and the tables the fast path must
leave to the file-by-file one (a renamed column). Each write runs twice (the rerun must change
nothing). On the SQL catalog (local files) and on SeaweedFS's REST catalog over S3, where the key
scan reads the files through the table's FileIO (`key_scan.ObjectFiles`) — SeaweedFS gives every
table a name mapping of its own schema's names, which must not send the merge file by file."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec
from pipeline_output.contract.slices import PartitionSlice, TimeRange
from pipeline_output.stores.iceberg.write import key_scan
from pipeline_output_tests.iceberg_harness import customers
from pipeline_output_tests.oracle import assert_same_multiset

pytestmark = pytest.mark.both_catalogs

PATHS = ("vectorised", "file_by_file")
HINTS = ("merge-on-read", "copy-on-write")


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "file_by_file":
        monkeypatch.setattr(key_scan, "VECTORISED", False)
    return str(request.param)


def _spec(strategy: str, hint: str, *, pk: tuple[str, ...] = ("id",)) -> DatasetSpec:
    return DatasetSpec(
        name="spread",
        primary_key=pk,
        strategy=strategy,  # type: ignore[arg-type]
        write_strategy_hint=hint,  # type: ignore[arg-type]
    )


def _files(h: Any, spec: DatasetSpec, parts: int = 4, per: int = 25) -> None:
    """`parts` data files of `per` rows each (ids 1..parts*per), one append each."""
    appends = dataclasses.replace(spec, strategy="append_always")
    for j in range(parts):
        h.store().write(appends, customers(range(j * per + 1, (j + 1) * per + 1)))
    assert len(list(h.table(spec).scan().plan_files())) == parts


def _spread_change() -> pl.DataFrame:
    """Keys in every file: some changed in every column, some only in `amount` (the column the
    comparison reads last: largest), some identical, and new keys."""
    changed = customers([3, 28, 53, 78], version=5)
    only_amount = customers([10, 35, 60, 85]).with_columns(pl.col("amount") + 0.25)
    same = customers([11, 36, 61, 86])
    new = customers(range(200, 206), version=1)
    return pl.concat([changed, only_amount, same, new])


@pytest.mark.rest_default
@pytest.mark.parametrize("hint", HINTS)
def test_an_upsert_spread_over_every_file_matches_the_oracle_on_both_paths(
    h, path, hint, catalog_backend
):
    spec = _spec("snapshot_replace", hint)
    _files(h, spec)
    res, _ = h.write_and_check(spec, _spread_change(), run_id="u1")
    assert (res.rows_updated, res.rows_unchanged, res.rows_inserted) == (8, 4, 6)
    where = "object-store" if catalog_backend == "rest" else "local"
    expected = (
        f"key_scan (4 candidate file(s), {where} Parquet"
        if path == "vectorised"
        else "frame (fallback: the key"
    )
    assert res.merge_path.startswith(expected), res.merge_path
    assert res.files_merged_on_read + res.files_rewritten == 4
    again, _ = h.write_and_check(spec, _spread_change(), run_id="u2")
    assert again.snapshot_id is None and again.rows_unchanged == 18


@pytest.mark.rest_default
@pytest.mark.parametrize("hint", HINTS)
def test_a_sync_deletes_absent_keys_in_every_file_on_both_paths(h, path, hint):
    spec = _spec("sync", hint)
    _files(h, spec)
    # the second upsert lands on files that already carry delete files (merge-on-read)
    h.write_and_check(_spec("snapshot_replace", hint), _spread_change(), run_id="s0")
    keep = pl.concat([_spread_change(), customers(range(40, 50))])
    h.write_and_check(spec, keep, run_id="s1")
    res, _ = h.write_and_check(spec, keep, run_id="s2")
    assert res.snapshot_id is None


@pytest.mark.rest_default
def test_files_read_column_by_column_by_ranges_match_the_oracle(h, monkeypatch):
    """On an object store a small candidate file is fetched whole (`key_scan.WHOLE_FILE_BYTES`);
    a larger one is read by ranged requests, a pass's columns at a time: here every file is."""
    monkeypatch.setattr(key_scan, "WHOLE_FILE_BYTES", 0)
    spec = _spec("sync", "merge-on-read")
    _files(h, spec)
    h.write_and_check(_spec("snapshot_replace", "merge-on-read"), _spread_change(), run_id="s0")
    keep = pl.concat([_spread_change(), customers(range(40, 50))])
    res, _ = h.write_and_check(spec, keep, run_id="s1")  # files with delete files of ours
    assert res.merge_path.startswith("key_scan (5 candidate file(s)"), res.merge_path
    again, _ = h.write_and_check(spec, keep, run_id="s2")
    assert again.snapshot_id is None


@pytest.mark.parametrize("hint", HINTS)
def test_append_new_spread_over_every_file_skips_live_keys_on_both_paths(h, path, hint):
    spec = _spec("append_new", hint)
    _files(h, spec)
    # keys deleted by position (merge-on-read) or rewritten away (copy-on-write) are not live
    h.write_and_check(_spec("sync", hint), customers(range(1, 90)), run_id="a0")
    data = pl.concat([customers([2, 27, 52, 77], version=6), customers(range(88, 96), version=1)])
    res, _ = h.write_and_check(spec, data, run_id="a1")
    assert (res.rows_skipped, res.rows_inserted) == (6, 6)  # 2, 27, 52, 77, 88, 89 are live
    again, _ = h.write_and_check(spec, data, run_id="a2")
    assert again.snapshot_id is None and again.rows_skipped == 12


@pytest.mark.parametrize("hint", HINTS)
def test_a_sync_of_a_dagster_partition_spread_over_every_file_on_both_paths(h, path, hint):
    spec = _spec("sync", hint)
    _files(h, spec)  # day 2024-01-03 holds ids 2, 30, 58 and 86: one in each file
    before = h.store().read(spec)
    third = PartitionSlice(
        "2024-01-03",
        (TimeRange("day", datetime(2024, 1, 3, tzinfo=UTC), datetime(2024, 1, 4, tzinfo=UTC)),),
    )
    data = pl.concat([customers([2, 30], version=3), customers([58, 114])])  # 86 is gone
    res = h.store().write(spec, data, partition=third, run_id="p1")
    expected = pl.concat([before.filter(pl.col("day") != date(2024, 1, 3)), data])
    assert_same_multiset(h.store().read(spec), expected)
    counts = (res.rows_updated, res.rows_unchanged, res.rows_inserted, res.rows_deleted)
    assert counts == (2, 1, 1, 1)  # keys absent outside the slice are kept
    again = h.store().write(spec, data, partition=third, run_id="p2")
    assert again.snapshot_id is None and again.rows_unchanged == 4


def test_nan_and_null_values_compare_equal_on_a_rerun(h, path):
    spec = _spec("snapshot_replace", "merge-on-read")
    _files(h, spec)
    odd = customers([5, 30, 55, 80]).with_columns(
        amount=pl.Series([float("nan"), None, float("nan"), 1.0]),
        name=pl.Series([None, "x", None, None], dtype=pl.String),
    )
    h.write_and_check(spec, odd, run_id="n1")
    res, _ = h.write_and_check(spec, odd, run_id="n2")
    assert res.snapshot_id is None and res.rows_unchanged == 4


def test_a_composite_key_upsert_matches_the_oracle_on_both_paths(h, path):
    spec = _spec("snapshot_replace", "merge-on-read", pk=("id", "name"))
    _files(h, spec)
    data = pl.concat(
        [
            customers([7, 32], version=0).with_columns(pl.col("amount") * 3),  # same (id, name)
            customers([57], version=4),  # new name: a new (id, name) key
        ]
    )
    res, _ = h.write_and_check(spec, data, run_id="c1")
    assert (res.rows_updated, res.rows_inserted) == (2, 1)


def test_a_renamed_column_leaves_the_merge_to_the_file_by_file_path(h):
    spec = _spec("snapshot_replace", "merge-on-read")
    _files(h, spec)
    table = h.table(spec)
    with table.update_schema() as update:
        update.rename_column("name", "label")
    table = h.table(spec)
    tasks = list(table.scan().plan_files())
    path = key_scan.choose_merge_path(table, table.schema(), tasks)
    # a file's column `name` is today's `label`: read through pyiceberg, and said why
    assert path == key_scan.MergePath("frame", "fallback: column 'label' was renamed (from 'name')")
    renamed = DatasetSpec(name="spread", primary_key=("id",), write_strategy_hint="merge-on-read")
    res = h.store().write(renamed, customers([1, 30], version=7).rename({"name": "label"}))
    assert res.rows_updated == 2
    assert res.merge_path == "frame (fallback: column 'label' was renamed (from 'name'))"
    after = h.store().read(renamed).sort("id")
    assert after.filter(pl.col("id") == 30)["label"].item() == "c30-v7"
    assert after.height == 100
