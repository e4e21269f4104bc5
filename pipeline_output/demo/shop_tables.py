"""The demo shop's tables: names, keys, watermarks, columns, polars types and DDL.

Schema `shop`: `raw_customers` (key `customer_id`, change marker `updated_seq`), `raw_products`
(key `product_id`, change marker `updated_seq`), `raw_orders` and `raw_order_events` (append-only,
watermark `seq`), `_ticks` (one row per applied tick). Declarations only; `shop_data` does the I/O.
"""

from __future__ import annotations

from typing import LiteralString

import polars as pl

SCHEMA = "shop"
"""The Postgres schema holding the demo's source tables."""

CUSTOMERS = "raw_customers"
PRODUCTS = "raw_products"
ORDERS = "raw_orders"
ORDER_EVENTS = "raw_order_events"
TABLES: tuple[str, ...] = (CUSTOMERS, PRODUCTS, ORDERS, ORDER_EVENTS)
"""The source tables, in dependency (load) order."""
TICKS = "_ticks"

PRIMARY_KEYS: dict[str, str] = {
    CUSTOMERS: "customer_id",
    PRODUCTS: "product_id",
    ORDERS: "order_id",
    ORDER_EVENTS: "event_id",
}
WATERMARKS: dict[str, str] = {
    CUSTOMERS: "updated_seq",
    PRODUCTS: "updated_seq",
    ORDERS: "seq",
    ORDER_EVENTS: "seq",
}
"""Per table, the column that strictly increases with every inserted or changed row."""

COLUMNS: dict[str, tuple[str, ...]] = {
    CUSTOMERS: ("customer_id", "name", "email", "country", "segment", "signup_at", "updated_seq"),
    PRODUCTS: ("product_id", "name", "category", "price", "active", "updated_seq"),
    ORDERS: (
        "order_id",
        "customer_id",
        "product_id",
        "quantity",
        "amount",
        "status",
        "ordered_at",
        "seq",
    ),
    ORDER_EVENTS: ("event_id", "order_id", "event_type", "at", "seq"),
}

POLARS_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    CUSTOMERS: {
        "customer_id": pl.Int64(),
        "name": pl.String(),
        "email": pl.String(),
        "country": pl.String(),
        "segment": pl.String(),
        "signup_at": pl.Datetime("us", "UTC"),
        "updated_seq": pl.Int64(),
    },
    PRODUCTS: {
        "product_id": pl.Int64(),
        "name": pl.String(),
        "category": pl.String(),
        "price": pl.Decimal(10, 2),
        "active": pl.Boolean(),
        "updated_seq": pl.Int64(),
    },
    ORDERS: {
        "order_id": pl.Int64(),
        "customer_id": pl.Int64(),
        "product_id": pl.Int64(),
        "quantity": pl.Int32(),
        "amount": pl.Decimal(12, 2),
        "status": pl.String(),
        "ordered_at": pl.Datetime("us", "UTC"),
        "seq": pl.Int64(),
    },
    ORDER_EVENTS: {
        "event_id": pl.Int64(),
        "order_id": pl.Int64(),
        "event_type": pl.String(),
        "at": pl.Datetime("us", "UTC"),
        "seq": pl.Int64(),
    },
}
"""The polars types `read_table` returns (numeric columns as exact decimals)."""

DDL: tuple[LiteralString, ...] = (
    "CREATE SCHEMA IF NOT EXISTS {schema}",
    """CREATE TABLE IF NOT EXISTS {schema}.raw_customers (
        customer_id bigint PRIMARY KEY,
        name text NOT NULL,
        email text NOT NULL,
        country text NOT NULL,
        segment text NOT NULL,
        signup_at timestamptz NOT NULL,
        updated_seq bigint NOT NULL UNIQUE
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}.raw_products (
        product_id bigint PRIMARY KEY,
        name text NOT NULL,
        category text NOT NULL,
        price numeric(10, 2) NOT NULL CHECK (price > 0),
        active boolean NOT NULL,
        updated_seq bigint NOT NULL UNIQUE
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}.raw_orders (
        order_id bigint PRIMARY KEY,
        customer_id bigint NOT NULL REFERENCES {schema}.raw_customers,
        product_id bigint NOT NULL REFERENCES {schema}.raw_products,
        quantity integer NOT NULL CHECK (quantity > 0),
        amount numeric(12, 2) NOT NULL,
        status text NOT NULL,
        ordered_at timestamptz NOT NULL,
        seq bigint NOT NULL UNIQUE
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}.raw_order_events (
        event_id bigint PRIMARY KEY,
        order_id bigint NOT NULL REFERENCES {schema}.raw_orders,
        event_type text NOT NULL,
        at timestamptz NOT NULL,
        seq bigint NOT NULL UNIQUE
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}._ticks (
        tick integer PRIMARY KEY CHECK (tick >= 0),
        seed bigint NOT NULL,
        rows_inserted integer NOT NULL,
        rows_updated integer NOT NULL
    )""",
)
