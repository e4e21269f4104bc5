"""The demo shop's rows, generated: a pure, deterministic function of (seed, tick number).

Owns the sizes of the seed and of a tick, the vocabularies, and `generate_seed` / `generate_tick`
(no I/O: `shop_data` writes what they return). Random choices come from `random.Random` seeded
with a string (stable across processes and Python versions); timestamps are whole seconds from a
fixed base.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

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
