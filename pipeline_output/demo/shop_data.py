"""The demo shop's source tables in Postgres: seeding, ticking, reading (rows from `shop_rows`).

Owns schema `shop` in a Postgres database given by a libpq URL:

- `raw_customers` (key `customer_id`, change marker `updated_seq`),
- `raw_products` (key `product_id`, change marker `updated_seq`),
- `raw_orders` (key `order_id`, append-only, watermark `seq`),
- `raw_order_events` (key `event_id`, append-only, watermark `seq`),
- `_ticks`: one row per applied tick (tick 0 is the seed), so tick N is reproducible.

`seed(url, seed=42)` (re)creates the tables and replaces their contents with the same rows for the
same seed. `tick(url)` then grows the shop by one simulated day: new customers, products, orders and
events, plus changes to existing rows (customers renamed or re-segmented, products re-priced,
deactivated or reactivated). Every changed or new customer/product gets a fresh `updated_seq`, every
new order/event a fresh `seq`, each strictly above all earlier ones, so all four columns work as
watermarks. Orders are immutable once written (their status is the one they had when ingested);
later lifecycle facts arrive as events. The k-th tick after a seed always produces the same rows.

Random choices come from `random.Random` seeded with a string (stable across processes and Python
versions), timestamps are whole seconds from a fixed base, and all state a tick reads is read in
key order, so the whole history is a pure function of (seed, tick number). Bulk loads use COPY;
identifiers are composed with `psycopg.sql`, values always travel as parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import polars as pl
import psycopg
from psycopg import sql

from pipeline_output.demo.shop_rows import (  # re-exported: the shop's one public module
    EVENT_TYPES,
    ORDER_STATUSES,
    SEED_CUSTOMERS,
    SEED_DAYS,
    SEED_ORDERS,
    SEED_PRODUCTS,
    SEGMENTS,
    TICK_CHANGED_CUSTOMERS,
    TICK_DEACTIVATED_PRODUCTS,
    TICK_NEW_CUSTOMERS,
    TICK_NEW_ORDERS,
    TICK_NEW_PRODUCTS,
    TICK_REPRICED_PRODUCTS,
    TICK_RETURNS,
    Row,
    ShopRows,
    ShopState,
    TickRows,
    generate_seed,
    generate_tick,
)
from pipeline_output.demo.shop_tables import (  # re-exported too
    COLUMNS,
    CUSTOMERS,
    DDL,
    ORDER_EVENTS,
    ORDERS,
    POLARS_SCHEMAS,
    PRIMARY_KEYS,
    PRODUCTS,
    SCHEMA,
    TABLES,
    TICKS,
    WATERMARKS,
)
from pipeline_output.errors import InvalidArgument, ShopNotSeeded
from pipeline_output.infra import pgsession

_LOCK_KEY = 0x5E0D_0DE0_5409  # pg_advisory_xact_lock key serialising seed/tick on one database

# --- Postgres I/O ---------------------------------------------------------------------------------


def _table(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(name))


def _lock(cur: psycopg.Cursor[Any]) -> None:
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))


def _copy(cur: psycopg.Cursor[Any], table: str, rows: Iterable[Row]) -> None:
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        _table(table), sql.SQL(", ").join(map(sql.Identifier, COLUMNS[table]))
    )
    with cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)


def _is_seeded(cur: psycopg.Cursor[Any]) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{SCHEMA}"."{TICKS}"',))
    row = cur.fetchone()
    return bool(row and row[0])


def _require_seeded(cur: psycopg.Cursor[Any]) -> None:
    if not _is_seeded(cur):
        raise ShopNotSeeded(
            f"the demo shop is not seeded in this database (no {SCHEMA}.{TICKS} table); "
            "run `pipeline-output demo seed` first"
        )


def seed(url: str, *, seed: int = 42) -> dict[str, int]:
    """Create schema `shop` and its tables if needed and replace their contents with the seed.

    The same `seed` always produces the same rows. Returns the row count per source table.
    """
    rows = generate_seed(seed)
    with pgsession.connect(url) as conn, conn.cursor() as cur:
        _lock(cur)
        for statement in DDL:
            cur.execute(sql.SQL(statement).format(schema=sql.Identifier(SCHEMA)))
        cur.execute(
            sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(_table(t) for t in (*TABLES, TICKS)))
        )
        _copy(cur, CUSTOMERS, rows.customers)
        _copy(cur, PRODUCTS, rows.products)
        _copy(cur, ORDERS, rows.orders)
        _copy(cur, ORDER_EVENTS, rows.events)
        inserted = {
            CUSTOMERS: len(rows.customers),
            PRODUCTS: len(rows.products),
            ORDERS: len(rows.orders),
            ORDER_EVENTS: len(rows.events),
        }
        cur.execute(
            sql.SQL("INSERT INTO {} VALUES (0, %s, %s, 0)").format(_table(TICKS)),
            (seed, sum(inserted.values())),
        )
    return inserted


def _fetch(
    cur: psycopg.Cursor[Any], query: sql.Composed | sql.SQL, params: Sequence[Any] = ()
) -> list[Row]:
    cur.execute(query, params)
    return [tuple(r) for r in cur.fetchall()]


def _read_state(cur: psycopg.Cursor[Any]) -> ShopState:
    def select(table: str) -> sql.Composed:
        return sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            sql.SQL(", ").join(map(sql.Identifier, COLUMNS[table])),
            _table(table),
            sql.Identifier(PRIMARY_KEYS[table]),
        )

    def max_of(table: str, column: str) -> int:
        rows = _fetch(
            cur,
            sql.SQL("SELECT coalesce(max({}), 0) FROM {}").format(
                sql.Identifier(column), _table(table)
            ),
        )
        return int(rows[0][0])

    returnable = _fetch(
        cur,
        sql.SQL(
            "SELECT o.order_id FROM {orders} o WHERE o.status = 'delivered' AND NOT EXISTS "
            "(SELECT 1 FROM {events} e WHERE e.order_id = o.order_id AND e.event_type = 'returned')"
            " ORDER BY o.order_id"
        ).format(orders=_table(ORDERS), events=_table(ORDER_EVENTS)),
    )
    return ShopState(
        customers=_fetch(cur, select(CUSTOMERS)),
        products=_fetch(cur, select(PRODUCTS)),
        max_order_id=max_of(ORDERS, "order_id"),
        max_event_id=max_of(ORDER_EVENTS, "event_id"),
        returnable_orders=[int(r[0]) for r in returnable],
    )


def tick(url: str, *, seed: int | None = None) -> dict[str, int]:
    """Grow the shop by one simulated day (new and changed rows), in one transaction.

    `seed` defaults to the seed the shop was seeded with (recorded in `shop._ticks`), so the k-th
    tick after a seed is always the same. Returns `tick` (its number) and, per source table,
    `<table>_inserted` / `<table>_updated`.
    """
    with pgsession.connect(url) as conn, conn.cursor() as cur:
        _lock(cur)
        _require_seeded(cur)
        last = _fetch(
            cur,
            sql.SQL("SELECT tick, seed FROM {} ORDER BY tick DESC LIMIT 1").format(_table(TICKS)),
        )
        if not last:
            raise ShopNotSeeded("the demo shop has no seed record; run `pipeline-output demo seed`")
        number = int(last[0][0]) + 1
        rng_seed = int(last[0][1]) if seed is None else seed
        rows = generate_tick(_read_state(cur), seed=rng_seed, tick=number)

        _copy(cur, CUSTOMERS, rows.new.customers)
        _copy(cur, PRODUCTS, rows.new.products)
        cur.executemany(
            sql.SQL(
                "UPDATE {} SET name = %s, email = %s, segment = %s, updated_seq = %s "
                "WHERE customer_id = %s"
            ).format(_table(CUSTOMERS)),
            [(c[1], c[2], c[4], c[6], c[0]) for c in rows.changed_customers],
        )
        cur.executemany(
            sql.SQL(
                "UPDATE {} SET price = %s, active = %s, updated_seq = %s WHERE product_id = %s"
            ).format(_table(PRODUCTS)),
            [(p[3], p[4], p[5], p[0]) for p in rows.changed_products],
        )
        _copy(cur, ORDERS, rows.new.orders)
        _copy(cur, ORDER_EVENTS, rows.new.events)
        result = {
            "tick": number,
            f"{CUSTOMERS}_inserted": len(rows.new.customers),
            f"{CUSTOMERS}_updated": len(rows.changed_customers),
            f"{PRODUCTS}_inserted": len(rows.new.products),
            f"{PRODUCTS}_updated": len(rows.changed_products),
            f"{ORDERS}_inserted": len(rows.new.orders),
            f"{ORDERS}_updated": 0,
            f"{ORDER_EVENTS}_inserted": len(rows.new.events),
            f"{ORDER_EVENTS}_updated": 0,
        }
        inserted = sum(v for k, v in result.items() if k.endswith("_inserted"))
        updated = sum(v for k, v in result.items() if k.endswith("_updated"))
        cur.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(_table(TICKS)),
            (number, rng_seed, inserted, updated),
        )
    return result


def counts(url: str) -> dict[str, int]:
    """Row count per source table; raises `ShopNotSeeded` when the shop does not exist."""
    with pgsession.connect(url) as conn, conn.cursor() as cur:
        _require_seeded(cur)
        return {
            table: int(_fetch(cur, sql.SQL("SELECT count(*) FROM {}").format(_table(table)))[0][0])
            for table in TABLES
        }


def current_tick(url: str) -> int | None:
    """The number of ticks applied since the last seed (0 right after it), or None if not seeded."""
    with pgsession.connect(url) as conn, conn.cursor() as cur:
        if not _is_seeded(cur):
            return None
        rows = _fetch(cur, sql.SQL("SELECT max(tick) FROM {}").format(_table(TICKS)))
        return None if rows[0][0] is None else int(rows[0][0])


def high_water_marks(url: str) -> dict[str, int]:
    """Per source table, the maximum of its watermark column (`WATERMARKS`); 0 when empty."""
    with pgsession.connect(url) as conn, conn.cursor() as cur:
        _require_seeded(cur)
        return {
            table: int(
                _fetch(
                    cur,
                    sql.SQL("SELECT coalesce(max({}), 0) FROM {}").format(
                        sql.Identifier(WATERMARKS[table]), _table(table)
                    ),
                )[0][0]
            )
            for table in TABLES
        }


def read_table(url: str, table: str) -> pl.DataFrame:
    """Read one source table with polars through ADBC (Arrow-native), in key order."""
    return read_tables(url, (table,))[table]


def read_tables(url: str, tables: Sequence[str] = TABLES) -> dict[str, pl.DataFrame]:
    """Read source tables with polars through one ADBC connection, each in key order.

    ADBC streams COPY BINARY into Arrow (no per-row Python objects). Its driver hands Postgres
    `numeric` over as an opaque string extension type; that is cast to the exact decimal of
    `POLARS_SCHEMAS` here, so the frames have the documented types.
    """

    for table in tables:
        if table not in COLUMNS:
            raise InvalidArgument(
                f"unknown demo source table {table!r}; known: {', '.join(TABLES)}"
            )
    frames: dict[str, pl.DataFrame] = {}
    with pgsession.adbc_connect(url) as conn:
        for table in tables:
            query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
                sql.SQL(", ").join(map(sql.Identifier, COLUMNS[table])),
                _table(table),
                sql.Identifier(PRIMARY_KEYS[table]),
            )
            frame = pl.read_database(query.as_string(), conn)
            frames[table] = normalise(frame, POLARS_SCHEMAS[table])
    return frames


def normalise(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Cast `frame`'s columns to `schema` (unwrapping Arrow extension types first)."""
    exprs = []
    for name, dtype in schema.items():
        expr = pl.col(name)
        if isinstance(frame.schema[name], pl.Extension):
            expr = expr.ext.storage()
        exprs.append(expr.cast(dtype))
    return frame.select(exprs)


__all__ = [
    "COLUMNS",
    "CUSTOMERS",
    "EVENT_TYPES",
    "ORDERS",
    "ORDER_EVENTS",
    "ORDER_STATUSES",
    "POLARS_SCHEMAS",
    "PRIMARY_KEYS",
    "PRODUCTS",
    "SCHEMA",
    "SEED_CUSTOMERS",
    "SEED_DAYS",
    "SEED_ORDERS",
    "SEED_PRODUCTS",
    "SEGMENTS",
    "TABLES",
    "TICKS",
    "TICK_CHANGED_CUSTOMERS",
    "TICK_DEACTIVATED_PRODUCTS",
    "TICK_NEW_CUSTOMERS",
    "TICK_NEW_ORDERS",
    "TICK_NEW_PRODUCTS",
    "TICK_REPRICED_PRODUCTS",
    "TICK_RETURNS",
    "WATERMARKS",
    "Row",
    "ShopRows",
    "ShopState",
    "TickRows",
    "counts",
    "current_tick",
    "generate_seed",
    "generate_tick",
    "high_water_marks",
    "normalise",
    "read_table",
    "read_tables",
    "seed",
    "tick",
]
