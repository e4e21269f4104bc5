"""Dagster's own asset parameters on `@dataset` (issue 34): each pass-through parameter is visible
on the built asset definition, `key_prefix` gives the key `[prefix..., name]` while the table keeps
the dataset's name, a dataset builds on a plain `@dg.asset` under `["raw", "orders"]` (loaded by
that asset's own IO manager), a delta dataset with an automation condition gets no window sensor,
and every misconfiguration fails when the code location loads, in one line naming the dataset.
"""

from __future__ import annotations

import runpy
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import pandas as pd
import polars as pl
import psycopg
import pytest

from pipeline_output import Delta, InvalidSpec, build_definitions, dataset, postgres_source
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output_tests.oracle import assert_same_multiset

DAILY = dg.DailyPartitionsDefinition(start_date="2024-01-01")
ORDERS = pl.DataFrame({"order_id": [1, 2, 3], "customer": ["a", "b", "a"], "amount": [5, 7, 11]})


def test_every_pass_through_parameter_is_on_the_asset_definition():
    eager = dg.AutomationCondition.eager()
    fresh = dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=24))
    retry = dg.RetryPolicy(max_retries=3, delay=1)
    backfill = dg.BackfillPolicy.multi_run(max_partitions_per_run=2)

    @dataset(
        primary_key="id",
        partitions_def=DAILY,
        partition_column="day",
        automation_condition=eager,
        freshness_policy=fresh,
        retry_policy=retry,
        code_version="v7",
        backfill_policy=backfill,
        key_prefix=["sales", "eu"],
        kinds=["dbt"],
        metadata={"team": "finance"},
    )
    def orders_clean(partition_key: str) -> pl.DataFrame:
        raise AssertionError("not run")

    (spec,) = orders_clean.specs
    assert orders_clean.key == dg.AssetKey(["sales", "eu", "orders_clean"])
    assert spec.automation_condition == eager
    assert spec.freshness_policy == fresh
    assert orders_clean.op.retry_policy == retry
    assert spec.code_version == "v7"
    assert orders_clean.backfill_policy == backfill  # an explicit policy wins
    assert spec.kinds == {"iceberg", "postgres", "dbt"}  # the arms (mode undecided) and the given
    assert spec.metadata["team"] == "finance"
    assert orders_clean.partitions_def == DAILY
    assert spec_of(orders_clean).name == "orders_clean"  # type: ignore[union-attr]


def test_a_partitioned_dataset_backfills_in_one_run_by_default_and_an_unpartitioned_one_has_none():
    @dataset(primary_key="id", partitions_def=DAILY, partition_column="day")
    def daily(partition_key: str) -> pl.DataFrame:
        raise AssertionError("not run")

    @dataset(primary_key="id")
    def whole() -> pl.DataFrame:
        raise AssertionError("not run")

    assert daily.backfill_policy == dg.BackfillPolicy.single_run()
    assert whole.backfill_policy is None


def test_a_dataset_downstream_of_a_plain_asset_under_raw_orders_materialises_with_it(env, instance):
    @dg.asset(key=["raw", "orders"])  # the default IO manager: a pickled polars frame
    def raw_orders() -> pl.DataFrame:
        return ORDERS

    @dg.asset(key=["raw", "customers"])  # a pandas frame
    def raw_customers() -> pd.DataFrame:
        return pd.DataFrame({"customer": ["a", "b"], "region": ["eu", "us"]})

    @dataset(
        primary_key="customer",
        mode="iceberg",
        key_prefix="marts",
        ins={
            "orders": dg.AssetIn(key=["raw", "orders"]),
            "customers": dg.AssetKey(["raw", "customers"]),
        },
    )
    def totals(orders: pl.LazyFrame, customers: pl.LazyFrame) -> pl.LazyFrame:
        assert isinstance(orders, pl.LazyFrame) and isinstance(customers, pl.LazyFrame)
        return (
            orders.group_by("customer").agg(pl.col("amount").sum()).join(customers, on="customer")
        )

    defs = build_definitions(datasets=[totals], assets=[raw_orders, raw_customers])
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance,
        asset_selection=[
            dg.AssetKey(["raw", "orders"]),
            dg.AssetKey(["raw", "customers"]),
            dg.AssetKey(["marts", "totals"]),
        ],
    )
    assert result.success
    expected = pl.DataFrame({"customer": ["a", "b"], "amount": [16, 7], "region": ["eu", "us"]})
    runtime = get_runtime()
    assert runtime.iceberg.table_name("totals") == "datasets.totals"  # the name, not the prefix
    assert_same_multiset(runtime.iceberg.read("totals").select(expected.columns), expected)


def test_a_delta_dataset_with_an_automation_condition_has_its_windows_run_by_it(env, instance):
    """Its sensor only plans windows and adds their partitions; the condition requests them."""
    with psycopg.connect(env, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, seq bigint NOT NULL)")
        conn.execute("INSERT INTO events SELECT g, g FROM generate_series(1, 5) AS g")
    source = postgres_source("events", table="events", watermark="seq")

    def build(**extra):
        @dataset(primary_key="id", delta=Delta(source="events", watermark="seq"), **extra)
        def clean_events(events: pl.LazyFrame) -> pl.LazyFrame:
            return events

        return build_definitions(datasets=[clean_events], sources=[source])

    def tick(defs: dg.Definitions) -> dg.SensorResult:
        sensor = defs.get_sensor_def("clean_events__window_sensor")
        result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        assert isinstance(result, dg.SensorResult)
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        return result

    # the source asset is never observed here: the condition must not wait for it
    on_missing = dg.AutomationCondition.on_missing().ignore(dg.AssetSelection.keys("events"))
    automated = build(automation_condition=on_missing)
    assert {s.name for s in automated.sensors} == {
        "clean_events__window_sensor",
        "table_maintenance_sensor",
    }
    first = dg.evaluate_automation_conditions(defs=automated, instance=instance)
    assert not tick(automated).run_requests  # planned and added, not run
    requested = dg.evaluate_automation_conditions(
        defs=automated, instance=instance, cursor=first.cursor
    )
    assert requested.total_requested == 1  # Dagster's automation runs the new window
    assert len(tick(build()).run_requests or []) == 1  # without it, the sensor runs it


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partitions_def": DAILY}, "partitions_def needs partition_column="),
        ({"partition_column": "day"}, "partition_column needs a partitions_def"),
        (
            {
                "partitions_def": dg.MultiPartitionsDefinition(
                    {"date": DAILY, "region": dg.StaticPartitionsDefinition(["eu"])}
                ),
                "partition_column": {"date": "day"},
            },
            r"for exactly its dimensions \['date', 'region'\]",
        ),
        (
            {"partitions_def": DAILY, "partition_column": "day", "delta": Delta("s", "seq")},
            "a delta dataset's partitions are its windows",
        ),
        ({"partitions_def": DAILY, "partition_column": "bad col"}, "not a valid identifier"),
        ({"ins": {"nope": dg.AssetKey("x")}}, r"ins names \['nope'\]"),
        ({"metadata": {"pipeline_output/x": 1}}, "reserved prefix"),
        ({"freshness_policy": "daily"}, "freshness_policy"),
    ],
)
def test_a_misconfigured_dataset_fails_at_load_in_one_line_naming_it(options, message):
    with pytest.raises(InvalidSpec, match=message) as refused:

        @dataset(primary_key="id", **options)
        def broken(s: pl.LazyFrame) -> pl.LazyFrame:
            return s

    text = str(refused.value)
    assert "'broken'" in text and "\n" not in text


def test_two_datasets_may_not_share_a_name_under_different_prefixes():
    def make(prefix: str) -> dg.AssetsDefinition:
        @dataset(name="orders", primary_key="id", key_prefix=prefix)
        def compute() -> pl.DataFrame:
            raise AssertionError("not run")

        return compute

    with pytest.raises(InvalidSpec, match="share the name 'orders'"):
        build_definitions(datasets=[make("a"), make("b")])


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "example_partitions.py"
REFERENCE = EXAMPLE.parent / "reference.md"


def test_reference_partitions_example_is_quoted_verbatim_and_materialises_a_day(env, instance):
    text = EXAMPLE.read_text(encoding="utf-8")
    assert f"```python\n{text}```" in REFERENCE.read_text(encoding="utf-8")
    defs = runpy.run_path(str(EXAMPLE))["defs"]
    job = defs.resolve_implicit_global_asset_job_def()
    for day in ("2026-12-01", "2026-12-02"):
        result = job.execute_in_process(
            instance=instance,
            asset_selection=[
                dg.AssetKey(["raw", "orders"]),
                dg.AssetKey(["marts", "daily_orders"]),
            ],
            partition_key=day,
        )
        assert result.success
    expected = pl.DataFrame(
        {
            "order_id": [1, 2, 3, 4],
            "day": [date(2026, 12, 1), date(2026, 12, 1), date(2026, 12, 2), date(2026, 12, 2)],
            "amount": [9.5, 20.0, 3.25, 7.0],
        }
    )
    assert_same_multiset(get_runtime().iceberg.read("daily_orders"), expected)
