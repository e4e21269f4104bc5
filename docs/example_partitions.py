from datetime import date

import dagster as dg
import polars as pl

from pipeline_output import build_definitions, dataset


@dg.asset(key=["raw", "orders"])
def raw_orders() -> pl.DataFrame:
    """An upstream of another tool (dlt, Sling, a plain asset), stored by its own IO manager."""
    return pl.DataFrame(
        {
            "order_id": [1, 2, 3, 4],
            "day": [date(2026, 12, 1), date(2026, 12, 1), date(2026, 12, 2), date(2026, 12, 2)],
            "amount": [9.5, 20.0, 3.25, 7.0],
        }
    )


@dataset(
    primary_key="order_id",
    mode="iceberg",
    partitions_def=dg.DailyPartitionsDefinition(start_date="2026-12-01"),
    partition_column="day",  # partition 2026-12-02 is the rows with day in [Dec 2, Dec 3)
    partition_by=("day(day)",),  # Iceberg files follow the days too
    ins={"orders": dg.AssetIn(key=["raw", "orders"])},
    key_prefix="marts",  # asset key marts/daily_orders; the table stays <namespace>.daily_orders
    automation_condition=dg.AutomationCondition.eager(),
)
def daily_orders(orders: pl.LazyFrame, partition_key: str) -> pl.LazyFrame:
    """One day's orders: materialising a day makes that day's slice exactly these rows."""
    return orders.filter(pl.col("day") == date.fromisoformat(partition_key))


defs = build_definitions(datasets=[daily_orders], assets=[raw_orders])
