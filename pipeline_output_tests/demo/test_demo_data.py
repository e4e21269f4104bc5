"""The demo shop's source data and computes, against a real Postgres.

Seeding and ticking are deterministic (compared across two databases), ticks add and change rows,
watermarks strictly increase, the sources read back with polars (ADBC and psycopg agree), and the
computes produce keyed, unique outputs whose contents match SQL computed independently.
"""

from __future__ import annotations

from decimal import Decimal

import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal

from pipeline_output.contract.spec import STRATEGIES
from pipeline_output.demo import computes, shop_data
from pipeline_output.demo.shop_data import CUSTOMERS, ORDER_EVENTS, ORDERS, PRODUCTS, TABLES

pytestmark = pytest.mark.integration


def snapshot(url: str) -> dict[str, pl.DataFrame]:
    """Every source table in key order (psycopg: one cheap connection; ADBC is tested below)."""
    frames = {}
    with psycopg.connect(url) as conn:
        for table in TABLES:
            key = shop_data.PRIMARY_KEYS[table]
            frame = pl.read_database(
                f"SELECT * FROM shop.{table} ORDER BY {key}", conn, infer_schema_length=None
            )
            frames[table] = shop_data.normalise(frame, shop_data.POLARS_SCHEMAS[table])
    return frames


def assert_same_shop(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> None:
    for table in TABLES:
        assert_frame_equal(a[table], b[table], check_exact=True)


def scalar(url: str, query: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


def test_seed_is_deterministic_and_reseeding_replaces(pg_db_url: str, other_db_url: str) -> None:
    counts = shop_data.seed(pg_db_url)
    assert shop_data.seed(other_db_url) == counts
    assert counts == shop_data.counts(pg_db_url)
    assert 3_000 <= sum(counts.values()) <= 20_000  # "a few thousand rows"
    first = snapshot(pg_db_url)
    assert_same_shop(first, snapshot(other_db_url))

    # Re-seeding after a tick (same database) restores exactly the seeded rows.
    shop_data.tick(pg_db_url)
    assert shop_data.seed(pg_db_url) == counts
    assert shop_data.current_tick(pg_db_url) == 0
    assert_same_shop(first, snapshot(pg_db_url))

    # A different seed is a different shop of the same size.
    other = shop_data.seed(other_db_url, seed=7)
    assert {t: other[t] for t in (CUSTOMERS, PRODUCTS, ORDERS)} == {
        t: counts[t] for t in (CUSTOMERS, PRODUCTS, ORDERS)
    }
    assert not snapshot(other_db_url)[CUSTOMERS].equals(first[CUSTOMERS])


def test_ticks_are_reproducible_and_differ_from_each_other(
    pg_db_url: str, other_db_url: str
) -> None:
    for url in (pg_db_url, other_db_url):
        shop_data.seed(url)
    one = shop_data.tick(pg_db_url)
    assert shop_data.tick(other_db_url) == one
    assert one["tick"] == 1
    after_one = snapshot(pg_db_url)
    assert_same_shop(after_one, snapshot(other_db_url))

    two = shop_data.tick(pg_db_url)
    assert two["tick"] == 2
    assert shop_data.tick(other_db_url) == two
    after_two = snapshot(pg_db_url)
    assert_same_shop(after_two, snapshot(other_db_url))

    # Tick 2's orders are not tick 1's orders shifted: compare the content columns.
    orders = after_two[ORDERS]
    seeded = shop_data.SEED_ORDERS
    per_tick = shop_data.TICK_NEW_ORDERS
    content = ["customer_id", "product_id", "quantity", "amount", "status"]
    tick1 = orders.filter(pl.col("seq").is_between(seeded + 1, seeded + per_tick))
    tick2 = orders.filter(pl.col("seq") > seeded + per_tick)
    assert tick1.height == tick2.height == per_tick
    assert not tick1.select(content).equals(tick2.select(content))
    assert tick2["ordered_at"].min() > tick1["ordered_at"].max()  # type: ignore[operator]

    # Seeding again and ticking once reproduces tick 1 (seed given explicitly this time).
    shop_data.seed(other_db_url)
    shop_data.tick(other_db_url, seed=42)
    assert_same_shop(after_one, snapshot(other_db_url))


def test_tick_adds_and_changes_rows(pg_db_url: str) -> None:
    shop_data.seed(pg_db_url)
    before = snapshot(pg_db_url)
    marks = shop_data.high_water_marks(pg_db_url)
    summary = shop_data.tick(pg_db_url)
    after = snapshot(pg_db_url)

    for table in TABLES:
        assert after[table].height == before[table].height + summary[f"{table}_inserted"]
    assert summary[f"{ORDERS}_inserted"] == shop_data.TICK_NEW_ORDERS
    assert summary[f"{ORDER_EVENTS}_inserted"] >= shop_data.TICK_NEW_ORDERS  # >= one per order

    # Changed customers: same key, different content, updated_seq above the old high-water mark.
    joined = before[CUSTOMERS].join(after[CUSTOMERS], on="customer_id", suffix="_new")
    changed = joined.filter(pl.col("updated_seq_new") != pl.col("updated_seq"))
    assert changed.height == summary[f"{CUSTOMERS}_updated"] > 0
    assert (changed["updated_seq_new"] > marks[CUSTOMERS]).all()
    differs = (
        (pl.col("name") != pl.col("name_new"))
        | (pl.col("email") != pl.col("email_new"))
        | (pl.col("segment") != pl.col("segment_new"))
    )
    assert changed.filter(differs).height == changed.height
    assert (
        joined.filter(pl.col("updated_seq_new") == pl.col("updated_seq")).filter(differs).is_empty()
    )

    # Products: some deactivated, some re-priced, all with bumped updated_seq.
    pj = before[PRODUCTS].join(after[PRODUCTS], on="product_id", suffix="_new")
    deactivated = pj.filter(pl.col("active") & ~pl.col("active_new"))
    repriced = pj.filter(pl.col("price") != pl.col("price_new"))
    assert deactivated.height == shop_data.TICK_DEACTIVATED_PRODUCTS
    assert repriced.height == shop_data.TICK_REPRICED_PRODUCTS
    bumped = pj.filter(pl.col("updated_seq_new") != pl.col("updated_seq"))
    assert bumped.height == summary[f"{PRODUCTS}_updated"]
    assert (bumped["updated_seq_new"] > marks[PRODUCTS]).all()

    # Orders are immutable: every seeded order is unchanged.
    assert_frame_equal(after[ORDERS].head(before[ORDERS].height), before[ORDERS])
    # New orders only buy products that are active after the tick.
    new_orders = after[ORDERS].filter(pl.col("seq") > marks[ORDERS])
    bought = new_orders.join(after[PRODUCTS], on="product_id")
    assert bought.height == new_orders.height and bought["active"].all()
    assert (bought["amount"] == bought["price"] * bought["quantity"]).all()


def test_watermarks_strictly_increase_across_ticks(pg_db_url: str) -> None:
    shop_data.seed(pg_db_url)
    previous = shop_data.high_water_marks(pg_db_url)
    for _ in range(3):
        before = snapshot(pg_db_url)
        shop_data.tick(pg_db_url)
        marks = shop_data.high_water_marks(pg_db_url)
        after = snapshot(pg_db_url)
        for table in TABLES:
            assert marks[table] > previous[table], table
            column = shop_data.WATERMARKS[table]
            assert after[table][column].is_unique().all(), table
            # Every row that is new or changed carries a watermark above the old high-water mark,
            # and every untouched row kept its watermark.
            key = shop_data.PRIMARY_KEYS[table]
            moved = after[table].join(before[table], on=key, how="left", suffix="_old")
            touched = moved.filter(
                pl.col(f"{column}_old").is_null() | (pl.col(column) != pl.col(f"{column}_old"))
            )
            assert (touched[column] > previous[table]).all(), table
            assert touched.height == after[table].filter(pl.col(column) > previous[table]).height
        # Sequences of append-only tables follow their ids.
        for table in (ORDERS, ORDER_EVENTS):
            frame = after[table]
            assert (frame["seq"] == frame[shop_data.PRIMARY_KEYS[table]]).all()
        previous = marks
    assert shop_data.current_tick(pg_db_url) == 3


def test_sources_read_with_polars_adbc_and_psycopg_agree(pg_db_url: str) -> None:
    shop_data.seed(pg_db_url)
    shop_data.tick(pg_db_url)
    tables = shop_data.read_tables(pg_db_url)
    assert_same_shop(tables, snapshot(pg_db_url))
    assert_frame_equal(shop_data.read_table(pg_db_url, PRODUCTS), tables[PRODUCTS])
    for table in TABLES:
        query = f"SELECT * FROM shop.{table}"
        adbc = pl.read_database_uri(query, pg_db_url, engine="adbc")
        assert adbc.height == shop_data.counts(pg_db_url)[table]
        with psycopg.connect(pg_db_url) as conn:
            via_psycopg = pl.read_database(query, conn, infer_schema_length=None)
        schema = shop_data.POLARS_SCHEMAS[table]
        key = shop_data.PRIMARY_KEYS[table]
        assert_frame_equal(
            shop_data.normalise(adbc, schema).sort(key),
            shop_data.normalise(via_psycopg, schema).sort(key),
        )
        assert_frame_equal(tables[table], shop_data.normalise(adbc, schema).sort(key))
        # The computes accept either reader's raw frames and agree on the result.
        for item in computes.DATASETS:
            if item.upstream == (table,):
                assert_frame_equal(
                    item.run({table: adbc.lazy()}).sort(item.primary_key or "event_id"),
                    item.run({table: via_psycopg.lazy()}).sort(item.primary_key or "event_id"),
                )


def test_computes_have_unique_keys_and_match_sql(pg_db_url: str) -> None:
    shop_data.seed(pg_db_url)
    shop_data.tick(pg_db_url)
    shop_data.tick(pg_db_url)
    raw = {
        table: pl.read_database_uri(f"SELECT * FROM shop.{table}", pg_db_url, engine="adbc").lazy()
        for table in TABLES
    }
    outputs = {item.name: item.run(raw) for item in computes.DATASETS}
    assert {item.strategy for item in computes.DATASETS} == set(STRATEGIES)
    for item in computes.DATASETS:
        spec = item.spec()
        assert spec.name == item.name and spec.strategy == item.strategy
        out = outputs[item.name]
        assert out.height > 0
        if item.primary_key:
            keys = out.select(item.primary_key)
            assert keys.null_count().sum_horizontal().item() == 0, item.name
            assert not keys.is_duplicated().any(), item.name
        for source in item.upstream:
            assert source in computes.SOURCES

    counts = shop_data.counts(pg_db_url)
    assert outputs["customers"].height == counts[CUSTOMERS]
    assert outputs["orders"].height == counts[ORDERS]
    assert outputs["order_events"].height == counts[ORDER_EVENTS]

    customers = outputs["customers"]
    assert (customers["email"] == customers["email"].str.strip_chars().str.to_lowercase()).all()
    assert not customers["name"].str.contains(r"^\s|\s$|\s\s").any()
    assert set(customers["segment"]) <= set(shop_data.SEGMENTS)

    # active_products: exactly the active products; the ones deactivated by a tick are gone.
    active = outputs["active_products"]
    inactive_ids = scalar(
        pg_db_url,
        "SELECT array_agg(product_id ORDER BY product_id) FROM shop.raw_products WHERE NOT active",
    )
    assert isinstance(inactive_ids, list) and inactive_ids
    assert active.filter(pl.col("product_id").is_in(inactive_ids)).is_empty()
    assert active.height == scalar(pg_db_url, "SELECT count(*) FROM shop.raw_products WHERE active")

    # daily_revenue: totals equal an independent SQL aggregate over non-cancelled orders.
    revenue = outputs["daily_revenue"]
    expected = scalar(
        pg_db_url, "SELECT sum(amount) FROM shop.raw_orders WHERE status <> 'cancelled'"
    )
    assert isinstance(expected, Decimal)
    assert revenue["revenue"].sum() == expected
    assert revenue["orders"].sum() == scalar(
        pg_db_url, "SELECT count(*) FROM shop.raw_orders WHERE status <> 'cancelled'"
    )
    days = scalar(
        pg_db_url,
        "SELECT count(DISTINCT (ordered_at AT TIME ZONE 'UTC')::date) FROM shop.raw_orders "
        "WHERE status <> 'cancelled'",
    )
    assert revenue.height == days
    assert revenue["day"].is_sorted()


def test_tick_and_counts_need_a_seed(pg_db_url: str) -> None:
    assert shop_data.current_tick(pg_db_url) is None
    with pytest.raises(shop_data.ShopNotSeeded, match="demo seed"):
        shop_data.tick(pg_db_url)
    with pytest.raises(shop_data.ShopNotSeeded):
        shop_data.counts(pg_db_url)
