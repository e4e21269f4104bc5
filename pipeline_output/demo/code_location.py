"""The demo shop as Dagster definitions: four Postgres sources and one dataset per strategy.

`customers` (snapshot_replace), `orders` (append_new) and `order_events` (append_always) are delta
datasets: each source watermark window is one partition, planned by the dataset's sensor (or by
`pipeline-output materialize`). `daily_revenue` (replace) and `active_products` (sync) recompute in
full. Everything is written to Iceberg (`mode="iceberg"`); flip a dataset to try the other arms.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from pipeline_output.contract.spec import Delta
from pipeline_output.dagster_layer.build import build_definitions
from pipeline_output.dagster_layer.dataset import dataset
from pipeline_output.dagster_layer.model_node import model_node
from pipeline_output.dagster_layer.source_assets import postgres_source
from pipeline_output.demo.computes import CHURN_FEATURES, DATASETS, SOURCES, churn_score

SOURCE_GROUP = "shop_sources"
DATASET_GROUP = "shop"


def demo_sources() -> list[Any]:
    """The shop's raw tables (schema `shop` of the control-plane Postgres) as source assets."""
    return [
        postgres_source(
            s.name,
            table=s.table,
            schema=s.schema,
            watermark=s.watermark,
            group=SOURCE_GROUP,
            description=f"Demo shop table {s.schema}.{s.table} (seeded by `pipeline-output demo seed`)",
        )
        for s in SOURCES.values()
    ]


def demo_datasets() -> list[dg.AssetsDefinition]:
    """One dataset per write strategy over the shop sources."""
    out = []
    for item in DATASETS:
        delta = (
            Delta(source=item.upstream[0], watermark=item.delta_watermark)
            if item.delta_watermark
            else None
        )
        out.append(
            dataset(
                item.name,
                primary_key=item.primary_key,
                strategy=item.strategy,
                mode="iceberg",
                delta=delta,
                group=DATASET_GROUP,
                description=item.description,
                tags={"demo": "shop"},
            )(item.compute)
        )
    return out


def demo_model(datasets: list[dg.AssetsDefinition]) -> dg.AssetsDefinition:
    """`customer_churn`: the churn model scored over `customers`, window by window."""
    customers = next(d for d in datasets if d.key == dg.AssetKey("customers"))
    return model_node(
        "customer_churn",
        source=customers,
        predict=churn_score,
        features=CHURN_FEATURES,
        mode="iceberg",
        group=DATASET_GROUP,
        description="Churn probability per customer (deterministic logistic model).",
    )


def demo_definitions() -> dg.Definitions:
    """The demo code location."""
    datasets = demo_datasets()
    return build_definitions(
        datasets=datasets, sources=demo_sources(), assets=[demo_model(datasets)]
    )


defs = demo_definitions()
