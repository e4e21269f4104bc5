"""The demo shop's datasets as pure polars computes, and their descriptions for the Dagster layer.

One dataset per write strategy, each a realistic transformation of the `shop` source tables:

| dataset | strategy | key | what it is |
|---|---|---|---|
| `customers` | snapshot_replace | customer_id | cleaned customer dimension |
| `orders` | append_new | order_id | order facts (orders are immutable once written) |
| `order_events` | append_always | — | order lifecycle event log |
| `daily_revenue` | replace | day | revenue, orders, customers per day (non-cancelled) |
| `active_products` | sync | product_id | the live catalogue (deactivated products drop out) |

Computes take the source tables as polars LazyFrames (column names as in `shop_data.COLUMNS`) and
return LazyFrames. They accept what the usual Postgres readers produce: `numeric` as an exact
decimal, a float, a string, or ADBC's opaque string extension type; timestamps tz-aware or naive
(taken as UTC). `DATASETS` and `SOURCES` describe the datasets and sources so the Dagster layer can
wrap them (`@dataset`, `postgres_source`) without repeating names, keys or strategies.
No I/O and no Dagster here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import polars as pl

from pipeline_output.contract.spec import DatasetSpec, Strategy
from pipeline_output.demo.shop_data import (
    CUSTOMERS,
    ORDER_EVENTS,
    ORDERS,
    PRODUCTS,
    SCHEMA,
    WATERMARKS,
)
from pipeline_output.errors import UnknownDataset

MONEY = pl.Decimal(12, 2)
PRICE = pl.Decimal(10, 2)
REVENUE = pl.Decimal(18, 2)
TIMESTAMP = pl.Datetime("us", "UTC")


# --- column normalisation -------------------------------------------------------------------------


def _decimal(frame: pl.LazyFrame, name: str, dtype: pl.Decimal) -> pl.Expr:
    """Column `name` as an exact decimal, whatever numeric representation the reader chose."""
    expr = pl.col(name)
    if isinstance(frame.collect_schema()[name], pl.Extension):
        expr = expr.ext.storage()  # ADBC hands `numeric` over as an opaque string extension
    return expr.cast(dtype)


def _utc(frame: pl.LazyFrame, name: str) -> pl.Expr:
    """Column `name` as a UTC timestamp in microseconds (naive timestamps are taken as UTC)."""
    dtype = frame.collect_schema()[name]
    expr = pl.col(name)
    if isinstance(dtype, pl.Datetime) and dtype.time_zone is None:
        expr = expr.dt.replace_time_zone("UTC")
    elif isinstance(dtype, pl.Datetime):
        expr = expr.dt.convert_time_zone("UTC")
    return expr.cast(TIMESTAMP)


def _stamped(frame: pl.LazyFrame, name: str, *, day: str) -> tuple[pl.Expr, pl.Expr]:
    """Column `name` as a UTC timestamp (`_utc`), and its UTC date as column `day`."""
    at = _utc(frame, name)
    return at.alias(name), at.dt.date().alias(day)


def _text(name: str) -> pl.Expr:
    """Trimmed text with runs of whitespace collapsed to one space."""
    return pl.col(name).str.strip_chars().str.replace_all(r"\s+", " ")


# --- computes -------------------------------------------------------------------------------------


def customers(raw_customers: pl.LazyFrame) -> pl.LazyFrame:
    """The customer dimension: names title-cased and trimmed, emails lower-cased, codes tidied."""
    return raw_customers.select(
        pl.col("customer_id").cast(pl.Int64),
        _text("name").str.to_titlecase().alias("name"),
        _text("email").str.to_lowercase().alias("email"),
        _text("country").str.to_uppercase().alias("country"),
        _text("segment").str.to_lowercase().alias("segment"),
        _utc(raw_customers, "signup_at").alias("signup_at"),
        pl.col("updated_seq").cast(pl.Int64),
    )


def orders(raw_orders: pl.LazyFrame) -> pl.LazyFrame:
    """Order facts: quantity, exact amount, status and the order's UTC date, keyed by order_id."""
    return raw_orders.select(
        pl.col("order_id").cast(pl.Int64),
        pl.col("customer_id").cast(pl.Int64),
        pl.col("product_id").cast(pl.Int64),
        pl.col("quantity").cast(pl.Int32),
        _decimal(raw_orders, "amount", MONEY).alias("amount"),
        _text("status").str.to_lowercase().alias("status"),
        *_stamped(raw_orders, "ordered_at", day="order_date"),
        pl.col("seq").cast(pl.Int64),
    )


def order_events(raw_order_events: pl.LazyFrame) -> pl.LazyFrame:
    """The order lifecycle log (created, paid, shipped, delivered, cancelled, returned); no key."""
    return raw_order_events.select(
        pl.col("event_id").cast(pl.Int64),
        pl.col("order_id").cast(pl.Int64),
        _text("event_type").str.to_lowercase().alias("event_type"),
        *_stamped(raw_order_events, "at", day="event_date"),
        pl.col("seq").cast(pl.Int64),
    )


def daily_revenue(raw_orders: pl.LazyFrame) -> pl.LazyFrame:
    """Per UTC day of non-cancelled orders: revenue, orders, distinct customers, items, AOV."""
    placed = raw_orders.select(
        _utc(raw_orders, "ordered_at").dt.date().alias("day"),
        pl.col("order_id"),
        pl.col("customer_id"),
        pl.col("quantity").cast(pl.Int64),
        _decimal(raw_orders, "amount", MONEY).alias("amount"),
        _text("status").str.to_lowercase().alias("status"),
    ).filter(pl.col("status") != "cancelled")
    return (
        placed.group_by("day")
        .agg(
            pl.col("amount").sum().cast(REVENUE).alias("revenue"),
            pl.col("order_id").n_unique().cast(pl.Int64).alias("orders"),
            pl.col("customer_id").n_unique().cast(pl.Int64).alias("customers"),
            pl.col("quantity").sum().cast(pl.Int64).alias("items"),
        )
        .with_columns(
            (pl.col("revenue").cast(pl.Float64) / pl.col("orders"))
            .round(2)
            .alias("avg_order_value")
        )
        .sort("day")
    )


def active_products(raw_products: pl.LazyFrame) -> pl.LazyFrame:
    """The live catalogue: active products only, so a deactivated product is deleted by sync."""
    return raw_products.filter(pl.col("active")).select(
        pl.col("product_id").cast(pl.Int64),
        _text("name").alias("name"),
        _text("category").str.to_lowercase().alias("category"),
        _decimal(raw_products, "price", PRICE).alias("price"),
        pl.col("updated_seq").cast(pl.Int64),
    )


# --- descriptions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoSource:
    """A source table of the demo shop in Postgres."""

    name: str
    table: str
    schema: str
    watermark: str | None  # strictly increasing with every new or changed row


@dataclass(frozen=True)
class DemoDataset:
    """A demo dataset: what the Dagster layer needs to wrap `compute` with `@dataset`.

    `upstream` names the compute's parameters, in order (source names from `SOURCES`).
    `delta_watermark` is the upstream column the dataset can be computed over window by window
    (the delta-windows issue); None when only full recomputation is correct (aggregates).
    """

    name: str
    primary_key: tuple[str, ...]
    strategy: Strategy
    upstream: tuple[str, ...]
    compute: Callable[..., pl.LazyFrame]
    description: str
    delta_watermark: str | None = None

    def spec(self) -> DatasetSpec:
        """The core `DatasetSpec` of this dataset (validated)."""
        return DatasetSpec(
            name=self.name,
            primary_key=self.primary_key,
            strategy=self.strategy,
            description=self.description,
        )

    def run(self, sources: Mapping[str, pl.LazyFrame]) -> pl.DataFrame:
        """Apply the compute to the named source frames and collect it (for tests and oracles)."""
        return self.compute(*(sources[name] for name in self.upstream)).collect()


SOURCES: dict[str, DemoSource] = {
    name: DemoSource(name=name, table=name, schema=SCHEMA, watermark=WATERMARKS[name])
    for name in (CUSTOMERS, PRODUCTS, ORDERS, ORDER_EVENTS)
}
"""Source name -> Postgres table (`shop.<name>`) and its watermark column."""

# name, primary key, strategy, upstream sources, compute, description, delta watermark
DATASETS: tuple[DemoDataset, ...] = tuple(
    DemoDataset(*row)
    for row in (
        ("customers", ("customer_id",), "snapshot_replace", (CUSTOMERS,), customers,
         "Customer dimension: cleaned names and emails, country, segment, signup.", "updated_seq"),
        ("orders", ("order_id",), "append_new", (ORDERS,), orders,
         "Order facts (immutable once placed): customer, product, quantity, amount.", "seq"),
        ("order_events", (), "append_always", (ORDER_EVENTS,), order_events,
         "Order lifecycle events, appended as they arrive.", "seq"),
        ("daily_revenue", ("day",), "replace", (ORDERS,), daily_revenue,
         "Revenue, orders, customers and items per UTC day, cancelled orders excluded.", None),
        ("active_products", ("product_id",), "sync", (PRODUCTS,), active_products,
         "The live catalogue: active products with their current price.", None),
    )
)  # fmt: skip
"""The demo datasets, one per write strategy."""


def dataset(name: str) -> DemoDataset:
    """The demo dataset called `name` (`UnknownDataset` naming the known ones otherwise)."""
    for item in DATASETS:
        if item.name == name:
            return item
    raise UnknownDataset(f"no demo dataset {name!r}; known: {', '.join(d.name for d in DATASETS)}")


# --- the model node ------------------------------------------------------------------------------

CHURN_FEATURES: tuple[str, ...] = ("segment", "country", "signup_at", "updated_seq")
"""The customer columns the churn model reads."""

_SEGMENT_WEIGHT = {"enterprise": -1.2, "smb": -0.3, "consumer": 0.4}


def churn_score(features: pl.DataFrame) -> pl.DataFrame:
    """A small, deterministic churn model: a logistic score over segment, tenure and activity.

    Tenure is measured from signup to the newest signup in the batch-independent reference date
    below, so the same customer always gets the same score whatever window it is read in.
    """
    reference = pl.datetime(2026, 1, 1, time_zone="UTC")
    signup = pl.col("signup_at")
    if (
        features.schema["signup_at"] == pl.Datetime("us")
        or getattr(features.schema["signup_at"], "time_zone", None) is None
    ):
        signup = signup.dt.replace_time_zone("UTC")
    tenure_days = (reference - signup).dt.total_days().cast(pl.Float64)
    segment_w = (
        pl.col("segment")
        .str.to_lowercase()
        .replace_strict(_SEGMENT_WEIGHT, default=0.0, return_dtype=pl.Float64)
    )
    logit = (
        0.8 + segment_w - tenure_days / 365.0 - (pl.col("updated_seq") % 7).cast(pl.Float64) * 0.05
    )
    score = 1.0 / (1.0 + (-logit).exp())
    return features.select(
        score.round(6).alias("churn_probability"),
        (score > 0.5).alias("likely_to_churn"),
    )
