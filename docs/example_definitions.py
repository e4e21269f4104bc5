"""Two pipeline-output datasets over a Postgres table (`public.sales`), as Dagster assets.

Load it with `dagster dev -f example_definitions.py` (or point a workspace at it) and
materialise both; the first run replaces, later runs apply each dataset's strategy.
"""

import polars as pl

from pipeline_output import build_definitions, dataset, postgres_source

# A table in the control-plane Postgres (PIPELINE_OUTPUT_PG_URL); pass url=... for another one.
sales_raw = postgres_source("sales_raw", table="sales", schema="public")


@dataset(primary_key="sale_id", mode="iceberg", group="sales")
def sales(sales_raw: pl.LazyFrame) -> pl.LazyFrame:
    """Every sale with its total; re-deploys upsert by sale_id (snapshot_replace)."""
    return sales_raw.select(
        "sale_id",
        pl.col("region").str.to_uppercase(),
        (pl.col("quantity") * pl.col("unit_price")).alias("total"),
    )


@dataset(primary_key="region", strategy="sync", mode="iceberg", group="sales")
def region_totals(sales: pl.LazyFrame) -> pl.LazyFrame:
    """Revenue per region; a region with no sales left is deleted (sync)."""
    return sales.group_by("region").agg(
        pl.col("total").sum().alias("revenue"), pl.len().alias("sales")
    )


defs = build_definitions(datasets=[sales, region_totals], sources=[sales_raw])
