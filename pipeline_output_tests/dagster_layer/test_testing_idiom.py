"""docs/reference.md's "Testing a dataset": `dg.materialize` of a dataset with the resources
`build_definitions` binds writes it (twice: the same rows), a partitioned one per `partition_key`."""

from __future__ import annotations

from datetime import date

import dagster as dg
import polars as pl

from pipeline_output import build_definitions, dataset
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output_tests.oracle import assert_same_multiset

ROWS = pl.DataFrame({"k": [1, 2], "v": ["a", "b"]})


@dataset(primary_key="k", mode="iceberg")
def things() -> pl.DataFrame:
    return ROWS


@dataset(
    primary_key="k",
    mode="iceberg",
    partitions_def=dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-03"),
    partition_column="day",
)
def daily(partition_key: str) -> pl.DataFrame:
    day = date.fromisoformat(partition_key)
    return pl.DataFrame({"k": [day.day], "day": [day]})


def test_dg_materialize_with_the_resources_build_definitions_binds_writes_the_dataset(
    env: str,
) -> None:
    resources = build_definitions(datasets=[things, daily], with_maintenance=False).resources
    for _ in range(2):
        assert dg.materialize([things], resources=resources).success
        assert_same_multiset(get_runtime().iceberg.read("things"), ROWS)
        assert dg.materialize([daily], resources=resources, partition_key="2024-01-02").success
        assert_same_multiset(
            get_runtime().iceberg.read("daily"),
            pl.DataFrame({"k": [2], "day": [date(2024, 1, 2)]}),
        )
