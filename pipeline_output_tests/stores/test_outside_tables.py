"""A table made outside the project keeps its layout (issue 30, item 5).

A table created with pyiceberg — an identity partition on a column, a sort order, properties of
its own — then written by the project for a dataset that says nothing about partitioning: the
table keeps its partition spec (the first deploy onto it, with or without a snapshot, and every
write after), its sort order and every property the user set; compaction writes files in the
table's sort order. `partition_by=()` says "unpartitioned" and evolves to it; `None` (the
default) is "not said", through `@dataset` and the spec's metadata round trip too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DateType, DoubleType, LongType, NestedField, StringType

from pipeline_output import DatasetSpec
from pipeline_output.contract.spec import spec_from_dict, spec_to_dict
from pipeline_output_tests.iceberg_harness import (
    NS,
    Harness,
    base,
    customers,
    redeploy_rows,
    spec_for,
)
from pipeline_output_tests.oracle import STRATEGIES, assert_same_multiset

USER_PROPERTIES = {
    "write.parquet.compression-codec": "snappy",  # the project's default is zstd
    "commit.manifest.min-count-to-merge": "7",  # the project's default is 16
    "write.metadata.previous-versions-max": "3",  # the project's default is 25
    "owner": "team-x",
}


def _outside_table(h: Harness, *, name: str = "customers") -> Any:
    """The harness's `customers` columns, partitioned by `name`'s identity, sorted by `amount`
    descending, with the user's properties: no snapshot yet."""
    h.catalog.create_namespace_if_not_exists(NS)
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
        NestedField(4, "day", DateType(), required=False),
        NestedField(5, "seq", LongType(), required=False),
        identifier_field_ids=[1],
    )
    return h.catalog.create_table(
        (NS, name),
        schema=schema,
        partition_spec=PartitionSpec(PartitionField(4, 1000, IdentityTransform(), "day")),
        sort_order=SortOrder(
            SortField(3, IdentityTransform(), SortDirection.DESC, NullOrder.NULLS_LAST)
        ),
        properties=USER_PROPERTIES,
    )


def _assert_layout_kept(h: Harness, spec: DatasetSpec) -> None:
    table = h.table(spec)
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("day", "identity")]
    (sort_field,) = table.sort_order().fields
    assert (sort_field.source_id, sort_field.direction) == (3, SortDirection.DESC)
    for key, value in USER_PROPERTIES.items():
        assert table.properties[key] == value, key
    for task in table.scan().plan_files():  # one day per file
        days = pl.read_parquet(task.file.file_path.removeprefix("file://"))["day"].unique()
        assert days.len() == 1, task.file.file_path


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_first_deploy_onto_an_outside_table_keeps_its_partitioning_sort_and_properties(
    h: Harness, strategy: str
) -> None:
    _outside_table(h)
    spec = spec_for(strategy)  # says nothing about partitioning
    res, _ = h.write_and_check(spec, base(), run_id="f1")
    assert (res.write_mode, res.first_deploy) == ("replace", True)
    _assert_layout_kept(h, spec)
    for run in ("r1", "r2"):
        h.write_and_check(spec, redeploy_rows(), run_id=run)
    _assert_layout_kept(h, spec)


def test_a_re_deploy_onto_an_outside_table_with_a_snapshot_keeps_its_layout(h: Harness) -> None:
    table = _outside_table(h)
    table.append(base().to_arrow().cast(table.schema().as_arrow()))
    spec = dataclasses.replace(spec_for("sync"), write_strategy_hint="merge-on-read")
    for run in ("r1", "r2"):
        h.write_and_check(spec, redeploy_rows(), run_id=run)
    _assert_layout_kept(h, spec)


def test_partition_by_empty_says_unpartitioned_and_evolves_the_outside_table_to_it(
    h: Harness,
) -> None:
    _outside_table(h)
    spec = dataclasses.replace(spec_for("snapshot_replace"), partition_by=())
    h.write_and_check(spec, base(), run_id="f1")
    h.write_and_check(spec, redeploy_rows(), run_id="r1")
    assert h.table(spec).spec().fields == ()
    assert USER_PROPERTIES.items() <= h.table(spec).properties.items()


def test_compaction_writes_files_in_the_outside_tables_sort_order(h: Harness) -> None:
    _outside_table(h)
    spec = spec_for("append_always")
    one_day = [i * 28 for i in range(1, 8)]  # every id on the same day: one partition
    for n in range(6):
        h.store().write(spec, customers([d + n for d in one_day if (d + n) % 28 == 0] or [28]))
    for n in range(6):
        h.store().write(spec, customers([28 * (n + 10)], version=n))
    before = h.raw(spec)
    result = h.store().compact(spec, min_input_files=2)
    assert result.files_added >= 1
    assert_same_multiset(h.raw(spec), before)
    for task in h.table(spec).scan().plan_files():
        amounts = pq.read_table(task.file.file_path.removeprefix("file://"))["amount"]
        values = amounts.to_pylist()
        assert values == sorted(values, reverse=True), task.file.file_path
    _assert_layout_kept(h, spec)


def test_partition_by_none_and_empty_survive_the_spec_metadata_round_trip() -> None:
    said_nothing = DatasetSpec(name="a", primary_key=("id",))
    unpartitioned = DatasetSpec(name="a", primary_key=("id",), partition_by=())
    assert said_nothing.partition_by is None and unpartitioned.partition_by == ()
    assert said_nothing != unpartitioned
    for spec in (said_nothing, unpartitioned):
        assert spec_from_dict(spec_to_dict(spec)) == spec
        assert spec.partition_terms == ()
