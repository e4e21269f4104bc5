"""The demo shop's source tables in Postgres: deterministic generation, seeding, ticking, reading.

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

import functools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, LiteralString

import polars as pl
import psycopg
from psycopg import sql

from pipeline_output import pgsession
from pipeline_output.errors import InvalidArgument, ShopNotSeeded

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

# --- sizes ----------------------------------------------------------------------------------------

BASE_TIME = datetime(2024, 1, 1, tzinfo=UTC)
"""The first instant of the seeded order history; tick k simulates day `SEED_DAYS + k - 1`."""
SEED_DAYS = 90
SEED_CUSTOMERS = 400
SEED_PRODUCTS = 60
SEED_ORDERS = 1500

TICK_NEW_CUSTOMERS = 8
TICK_CHANGED_CUSTOMERS = 12
TICK_NEW_PRODUCTS = 2
TICK_DEACTIVATED_PRODUCTS = 2
TICK_REPRICED_PRODUCTS = 3
TICK_NEW_ORDERS = 60
TICK_RETURNS = 4

_LOCK_KEY = 0x5E0D_0DE0_5409  # pg_advisory_xact_lock key serialising seed/tick on one database

# --- vocabularies ---------------------------------------------------------------------------------

_FIRST_NAMES = (
    "Alice", "Bruno", "Carmen", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas",
    "Kira", "Luis", "Maya", "Nikolai", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tariq",
    "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zoe",
)  # fmt: skip
_LAST_NAMES = (
    "Anders", "Baker", "Castillo", "Dubois", "Eriksen", "Fischer", "Garcia", "Hansen", "Ito",
    "Jensen", "Kowalski", "Lopez", "Martin", "Nakamura", "Okafor", "Petrov", "Quiroga", "Rossi",
    "Schmidt", "Tanaka", "Ueda", "Vargas", "Weber", "Xu", "Yamada", "Zimmer", "Smith-Jones",
)  # fmt: skip
_EMAIL_DOMAINS = ("example.com", "mail.test", "shop.example", "inbox.test")
_COUNTRIES = ("US", "GB", "DE", "FR", "ES", "NL", "SE", "BR", "JP", "CA")
_COUNTRY_WEIGHTS = (30, 12, 12, 10, 8, 6, 5, 7, 5, 5)
SEGMENTS: tuple[str, ...] = ("consumer", "smb", "enterprise")
_SEGMENT_WEIGHTS = (70, 22, 8)
_CATEGORIES: dict[str, tuple[str, ...]] = {
    "kitchen": ("Kettle", "Pan", "Knife Set", "Mug", "Grinder"),
    "outdoor": ("Tent", "Backpack", "Lantern", "Bottle", "Hammock"),
    "office": ("Notebook", "Desk Lamp", "Chair Mat", "Pen Set", "Monitor Stand"),
    "audio": ("Headphones", "Speaker", "Earbuds", "Turntable", "Microphone"),
    "garden": ("Hose", "Planter", "Shears", "Seed Kit", "Watering Can"),
}
_ADJECTIVES = ("Classic", "Compact", "Deluxe", "Eco", "Nordic", "Pro", "Rustic", "Smart", "Ultra")

ORDER_STATUSES: tuple[str, ...] = ("placed", "paid", "shipped", "delivered", "cancelled")
EVENT_TYPES: tuple[str, ...] = ("created", "paid", "shipped", "delivered", "cancelled", "returned")
_LIFECYCLE = ("created", "paid", "shipped", "delivered")


# --- row generation (pure) ------------------------------------------------------------------------

Row = tuple[Any, ...]


def _ts(seconds: int, *, start: datetime = BASE_TIME) -> datetime:
    return start + timedelta(seconds=seconds)


def _messy(rng: random.Random, text: str) -> str:
    """How a hand-typed value arrives: sometimes shouted, lower-cased or padded with spaces."""
    roll = rng.random()
    if roll < 0.1:
        text = text.upper()
    elif roll < 0.2:
        text = text.lower()
    if rng.random() < 0.15:
        text = "  " + text.replace(" ", "   ") + " "
    return text


def _person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)


def _email(rng: random.Random, first: str, last: str, customer_id: int) -> str:
    local = f"{first}.{last}{customer_id}"
    domain = rng.choice(_EMAIL_DOMAINS)
    if rng.random() < 0.2:
        return f" {local}@{domain.capitalize()}"
    return f"{local.lower()}@{domain}"


def _customer(rng: random.Random, customer_id: int, signup_at: datetime, seq: int) -> Row:
    first, last = _person(rng)
    country = rng.choices(_COUNTRIES, _COUNTRY_WEIGHTS)[0]
    if rng.random() < 0.05:
        country = country.lower()
    segment = rng.choices(SEGMENTS, _SEGMENT_WEIGHTS)[0]
    name = _messy(rng, f"{first} {last}")
    email = _email(rng, first, last, customer_id)
    return (customer_id, name, email, country, segment, signup_at, seq)


def _price(rng: random.Random) -> Decimal:
    return Decimal(rng.randint(299, 24999)) / 100


def _product(rng: random.Random, product_id: int, seq: int, *, active: bool) -> Row:
    category = rng.choice(sorted(_CATEGORIES))
    name = f"{rng.choice(_ADJECTIVES)} {rng.choice(_CATEGORIES[category])}"
    return (product_id, name, category, _price(rng), active, seq)


def _status(rng: random.Random, age_days: float) -> str:
    """An order's status when ingested: old orders are delivered (or were cancelled)."""
    if age_days > 7:
        return rng.choices(("delivered", "cancelled"), (88, 12))[0]
    return rng.choices(ORDER_STATUSES, (15, 25, 30, 20, 10))[0]


def _order_events(
    rng: random.Random, order_id: int, ordered_at: datetime, status: str
) -> list[Row]:
    """(order_id, event_type, at) for an order's lifecycle up to its status; ids assigned later."""
    if status == "cancelled":
        steps = ["created"] + (["paid"] if rng.random() < 0.5 else []) + ["cancelled"]
    else:
        steps = list(
            _LIFECYCLE[: _LIFECYCLE.index("created" if status == "placed" else status) + 1]
        )
    gaps = {
        "created": (0, 0),
        "paid": (60, 1800),
        "shipped": (6 * 3600, 48 * 3600),
        "delivered": (24 * 3600, 96 * 3600),
        "cancelled": (600, 12 * 3600),
    }
    at = ordered_at
    events: list[Row] = []
    for step in steps:
        low, high = gaps[step]
        at = at + timedelta(seconds=rng.randint(low, high))
        events.append((order_id, step, at))
    return events


def _number_events(events: list[Row], *, next_id: int) -> list[Row]:
    """Order events by time and give them consecutive ids and seqs from `next_id`."""
    ordered = sorted(events, key=lambda e: (e[2], e[0], EVENT_TYPES.index(e[1])))
    return [(next_id + i, oid, kind, at, next_id + i) for i, (oid, kind, at) in enumerate(ordered)]


@dataclass(frozen=True)
class ShopRows:
    """Rows for the four source tables, in `COLUMNS` order."""

    customers: tuple[Row, ...]
    products: tuple[Row, ...]
    orders: tuple[Row, ...]
    events: tuple[Row, ...]


@functools.lru_cache(maxsize=4)
def generate_seed(seed: int = 42) -> ShopRows:
    """The seeded shop (pure, cached): customers, products, `SEED_DAYS` days of orders, events."""
    rng = random.Random(f"pipeline-output-shop:seed:{seed}")
    customers = [
        _customer(rng, cid, _ts(-rng.randint(86_400, 730 * 86_400)), cid)
        for cid in range(1, SEED_CUSTOMERS + 1)
    ]
    products = [
        _product(rng, pid, pid, active=rng.random() >= 0.1) for pid in range(1, SEED_PRODUCTS + 1)
    ]
    active = [p for p in products if p[4]]
    horizon = SEED_DAYS * 86_400
    times = sorted(rng.randrange(horizon) for _ in range(SEED_ORDERS))
    orders: list[Row] = []
    raw_events: list[Row] = []
    for n, offset in enumerate(times, start=1):
        customer = rng.choice(customers)
        product = rng.choice(active)
        quantity = rng.choices((1, 2, 3, 4, 5), (55, 25, 10, 6, 4))[0]
        status = _status(rng, (horizon - offset) / 86_400)
        ordered_at = _ts(offset)
        orders.append(
            (n, customer[0], product[0], quantity, product[3] * quantity, status, ordered_at, n)
        )
        raw_events.extend(_order_events(rng, n, ordered_at, status))
    events = _number_events(raw_events, next_id=1)
    return ShopRows(tuple(customers), tuple(products), tuple(orders), tuple(events))


@dataclass(frozen=True)
class ShopState:
    """What a tick needs to know about the current tables (read in key order)."""

    customers: list[Row]
    products: list[Row]
    max_order_id: int
    max_event_id: int
    returnable_orders: list[int]  # delivered, not yet returned

    @property
    def max_customer_seq(self) -> int:
        return max((c[6] for c in self.customers), default=0)

    @property
    def max_product_seq(self) -> int:
        return max((p[5] for p in self.products), default=0)


@dataclass(frozen=True)
class TickRows:
    """One tick's effect: rows to insert and full new versions of changed rows."""

    new: ShopRows
    changed_customers: list[Row]
    changed_products: list[Row]


def generate_tick(state: ShopState, *, seed: int, tick: int) -> TickRows:
    """Tick `tick` (1-based) over `state` (pure): one more simulated day of the shop."""
    rng = random.Random(f"pipeline-output-shop:tick:{seed}:{tick}")
    day = _ts((SEED_DAYS + tick - 1) * 86_400)

    # Customers: a few re-segmented, renamed or with a new email; a few new sign-ups.
    customer_seq = state.max_customer_seq
    changed_customers: list[Row] = []
    for row in sorted(
        rng.sample(state.customers, min(TICK_CHANGED_CUSTOMERS, len(state.customers)))
    ):
        cid, name, email, country, segment, signup_at, _ = row
        kind = rng.choice(("rename", "resegment", "resegment", "email"))
        if kind == "rename":
            first = name.strip().split()[0].title()
            name = _messy(rng, f"{first} {rng.choice(_LAST_NAMES)}")
        elif kind == "resegment":
            segment = rng.choice([s for s in SEGMENTS if s != segment])
        else:
            first, last = _person(rng)
            email = _email(rng, first, last, cid)
        customer_seq += 1
        changed_customers.append((cid, name, email, country, segment, signup_at, customer_seq))
    max_cid = max((c[0] for c in state.customers), default=0)
    new_customers: list[Row] = []
    for cid in range(max_cid + 1, max_cid + TICK_NEW_CUSTOMERS + 1):
        customer_seq += 1
        new_customers.append(
            _customer(rng, cid, day + timedelta(seconds=rng.randrange(86_400)), customer_seq)
        )

    # Products: some deactivated, some re-priced, sometimes one reactivated; a few new ones.
    product_seq = state.max_product_seq
    active = [p for p in state.products if p[4]]
    inactive = [p for p in state.products if not p[4]]
    deactivated = rng.sample(active, min(TICK_DEACTIVATED_PRODUCTS, len(active)))
    still_active = [p for p in active if p not in deactivated]
    repriced = rng.sample(still_active, min(TICK_REPRICED_PRODUCTS, len(still_active)))
    reactivated = [rng.choice(inactive)] if inactive and rng.random() < 0.5 else []
    changes: dict[int, Row] = {}
    for p in deactivated:
        changes[p[0]] = (*p[:4], False, 0)
    for p in repriced:
        factor = Decimal(rng.randint(80, 125)) / 100
        price = max((p[3] * factor).quantize(Decimal("0.01")), Decimal("0.99"))
        changes[p[0]] = (*p[:3], price, True, 0)
    for p in reactivated:
        changes[p[0]] = (*p[:4], True, 0)
    changed_products: list[Row] = []
    for pid in sorted(changes):
        product_seq += 1
        changed_products.append((*changes[pid][:5], product_seq))
    max_pid = max((p[0] for p in state.products), default=0)
    new_products: list[Row] = []
    for pid in range(max_pid + 1, max_pid + TICK_NEW_PRODUCTS + 1):
        product_seq += 1
        new_products.append(_product(rng, pid, product_seq, active=True))

    # Orders of the day over the current catalogue, their events, and a few returns.
    current = {p[0]: p for p in state.products} | {p[0]: p for p in changed_products}
    current |= {p[0]: p for p in new_products}
    orderable = [current[pid] for pid in sorted(current) if current[pid][4]]
    buyers = state.customers + new_customers
    times = sorted(rng.randrange(86_400) for _ in range(TICK_NEW_ORDERS))
    orders: list[Row] = []
    raw_events: list[Row] = []
    for n, offset in enumerate(times, start=state.max_order_id + 1):
        customer = rng.choice(buyers)
        product = rng.choice(orderable)
        quantity = rng.choices((1, 2, 3, 4, 5), (55, 25, 10, 6, 4))[0]
        status = _status(rng, 0)
        ordered_at = max(day + timedelta(seconds=offset), customer[5])
        orders.append(
            (n, customer[0], product[0], quantity, product[3] * quantity, status, ordered_at, n)
        )
        raw_events.extend(_order_events(rng, n, ordered_at, status))
    returns = rng.sample(state.returnable_orders, min(TICK_RETURNS, len(state.returnable_orders)))
    for oid in sorted(returns):
        raw_events.append((oid, "returned", day + timedelta(seconds=rng.randrange(86_400))))
    events = _number_events(raw_events, next_id=state.max_event_id + 1)
    return TickRows(
        ShopRows(tuple(new_customers), tuple(new_products), tuple(orders), tuple(events)),
        changed_customers,
        changed_products,
    )


# --- Postgres I/O ---------------------------------------------------------------------------------

_DDL: tuple[LiteralString, ...] = (
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
        for statement in _DDL:
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
