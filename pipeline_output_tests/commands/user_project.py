"""A newcomer's own project, as README's first project tells them to write it, for tests that drive
the CLI as a real process from its directory (never the demo).

`make_project(root, pg_url)` writes `root/pyproject.toml` (`[tool.dagster] module_name =
"orders_pipeline.definitions"`) and the package `orders_pipeline`, and creates the Postgres table
`public.orders` with `ORDER_COUNT` rows (`order_rows`, the oracle the tests compare with). The code
location:

- `orders_raw`: a `postgres_source` over `public.orders` (watermark `updated_at`);
- `orders`: an upsert dataset (`snapshot_replace`: re-deploys upsert by key) (legacy arm, the project default mode);
- `order_changes`: a delta dataset over `orders_raw` (Iceberg), windows of at most
  `WINDOW_ROWS` rows (upserted), so a first run applies several windows;
- `region_totals`: a `sync` aggregate of `orders` with `audit=True` (Iceberg) and a blocking
  `@asset_check` `revenue_not_negative`, failing when a region's revenue is negative
  (`add_refund` makes it fail);
- `order_scores`: a model node over `order_changes` (independent of `region_totals`).

Other modules of the package, chosen with `-m`: `variants` (a Delta over a source without a
watermark, and over a source observing another column: both work as declared),
`missing_column` (a Delta over a column the table lacks), `unknown_source` (a Delta over no
source of the location) and `duplicates` (a compute returning duplicate keys).

`project_database(pg_url)` is a fresh database for a module's project; `instance(home, url)` the
project's Dagster instance as the CLI left it; `catalog(home, url)` its Iceberg catalog.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

MODULE = "orders_pipeline"
ORDER_COUNT = 350  # windows of 100, 100, 100 and 50 rows: each window's figures differ
WINDOW_ROWS = 100
REGIONS = ("north", "south", "east", "west")
START = datetime(2026, 11, 1, tzinfo=UTC)

PYPROJECT = """\
[project]
name = "orders-pipeline"
version = "0.1.0"

[tool.dagster]
module_name = "orders_pipeline.definitions"
"""

DEFINITIONS = f'''\
"""The orders pipeline: a newcomer's code location."""

import dagster as dg
import polars as pl

from pipeline_output import Delta, build_definitions, dataset, model_node, postgres_source

orders_raw = postgres_source("orders_raw", table="orders", watermark="updated_at")


@dataset(primary_key="order_id", strategy="snapshot_replace", group="orders")
def orders(orders_raw: pl.LazyFrame) -> pl.LazyFrame:
    """Every order, upserted by order_id."""
    return orders_raw.select("order_id", "region", "amount", "updated_at")


@dataset(
    primary_key="order_id",
    strategy="snapshot_replace",
    mode="iceberg",
    delta=Delta(source="orders_raw", watermark="updated_at", max_rows={WINDOW_ROWS}),
    group="orders",
)
def order_changes(orders_raw: pl.LazyFrame) -> pl.LazyFrame:
    """Orders changed in each window of updated_at."""
    return orders_raw.select("order_id", "region", "amount", "updated_at")


@dataset(primary_key="region", strategy="sync", mode="iceberg", audit=True, group="orders")
def region_totals(orders: pl.LazyFrame) -> pl.LazyFrame:
    """Revenue per region (audited: published only when its checks pass)."""
    return orders.group_by("region").agg(pl.col("amount").sum().alias("revenue"))


@dg.asset_check(asset="region_totals", blocking=True)
def revenue_not_negative(region_totals: pl.LazyFrame) -> dg.AssetCheckResult:
    negative = region_totals.filter(pl.col("revenue") < 0).collect()
    return dg.AssetCheckResult(
        passed=negative.height == 0, metadata={{"negative_regions": negative.height}}
    )


def big_order(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select("order_id", (pl.col("amount") > 100).alias("big"))


order_scores = model_node("order_scores", source=order_changes, predict=big_order, group="orders")

defs = build_definitions(
    datasets=[orders, order_changes, region_totals],
    sources=[orders_raw],
    assets=[order_scores],
    asset_checks=[revenue_not_negative],
)
'''

VARIANTS = '''\
"""Delta declarations a newcomer gets wrong (issue 32): each works as declared or fails at load."""

import polars as pl

from pipeline_output import Delta, build_definitions, dataset, postgres_source

# no watermark on the source: the Delta's column cuts and reads the windows
orders_plain = postgres_source("orders_plain", table="orders")
# the source observes `created_at`; the Delta says `updated_at`: the Delta's column wins
orders_created = postgres_source("orders_created", table="orders", watermark="created_at")


@dataset(primary_key="order_id", mode="iceberg", delta=Delta(source="orders_plain", watermark="updated_at"))
def plain_changes(orders_plain: pl.LazyFrame) -> pl.LazyFrame:
    return orders_plain.select("order_id", "updated_at")


@dataset(primary_key="order_id", mode="iceberg", delta=Delta(source="orders_created", watermark="updated_at"))
def created_changes(orders_created: pl.LazyFrame) -> pl.LazyFrame:
    return orders_created.select("order_id", "updated_at")


defs = build_definitions(
    datasets=[plain_changes, created_changes], sources=[orders_plain, orders_created]
)
'''

MISSING_COLUMN = '''\
"""A Delta over a column the source table lacks: only the database knows (the first tick)."""

import polars as pl

from pipeline_output import Delta, build_definitions, dataset, postgres_source

orders_raw = postgres_source("orders_raw", table="orders")


@dataset(primary_key="order_id", mode="iceberg", delta=Delta(source="orders_raw", watermark="modified_at"))
def modified_orders(orders_raw: pl.LazyFrame) -> pl.LazyFrame:
    return orders_raw.select("order_id")


defs = build_definitions(datasets=[modified_orders], sources=[orders_raw])
'''


UNKNOWN_SOURCE = '''\
"""A Delta over a source the code location does not define: refused when it loads."""

import polars as pl

from pipeline_output import Delta, build_definitions, dataset

@dataset(primary_key="order_id", delta=Delta(source="orders_typo", watermark="updated_at"))
def typo_changes(orders_typo: pl.LazyFrame) -> pl.LazyFrame:
    return orders_typo


defs = build_definitions(datasets=[typo_changes])
'''

DUPLICATES = '''\
"""A compute that returns every order twice: a data error, refused with nothing written."""

import polars as pl

from pipeline_output import build_definitions, dataset, postgres_source

orders_raw = postgres_source("orders_raw", table="orders")


@dataset(primary_key="order_id", mode="iceberg")
def doubled(orders_raw: pl.LazyFrame) -> pl.LazyFrame:
    rows = orders_raw.select("order_id", "amount")
    return pl.concat([rows, rows])


@dataset(primary_key="region", mode="iceberg")
def regions(orders_raw: pl.LazyFrame) -> pl.LazyFrame:
    return orders_raw.group_by("region").agg(pl.len().alias("orders"))


defs = build_definitions(datasets=[doubled, regions], sources=[orders_raw])
'''


def order_rows(count: int = ORDER_COUNT, *, first: int = 1) -> list[tuple[Any, ...]]:
    """`(order_id, region, amount, created_at, updated_at)`: one order a minute, amounts > 0."""
    rows = []
    for order_id in range(first, first + count):
        at = START + timedelta(minutes=order_id)
        amount = float(10 + (order_id * 37) % 190)
        rows.append((order_id, REGIONS[order_id % len(REGIONS)], amount, at, at))
    return rows


def insert_orders(url: str, rows: list[tuple[Any, ...]]) -> None:
    """Insert (or, on a known `order_id`, update) orders in the source table."""
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO public.orders VALUES (%s, %s, %s, %s, %s) ON CONFLICT (order_id) DO "
            "UPDATE SET region = excluded.region, amount = excluded.amount, "
            "updated_at = excluded.updated_at",
            rows,
        )


def add_refund(url: str, *, order_id: int = 1_000_000) -> None:
    """A refund large enough to make one region's revenue negative (the check then fails)."""
    at = START + timedelta(days=30)
    insert_orders(url, [(order_id, "north", -1_000_000.0, at, at)])


def make_project(root: Path, pg_url: str) -> Path:
    """Write the project under `root` and create + fill `public.orders` at `pg_url`."""
    package = root / MODULE
    package.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS)
    (package / "variants.py").write_text(VARIANTS)
    (package / "missing_column.py").write_text(MISSING_COLUMN)
    (package / "unknown_source.py").write_text(UNKNOWN_SOURCE)
    (package / "duplicates.py").write_text(DUPLICATES)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.orders (order_id bigint PRIMARY KEY, region text NOT NULL, "
            "amount double precision NOT NULL, created_at timestamptz NOT NULL, "
            "updated_at timestamptz NOT NULL)"
        )
    insert_orders(pg_url, order_rows())
    return root


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a command that must have succeeded (else its output, for the failure)."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@contextlib.contextmanager
def project_database(pg_url: str) -> Iterator[str]:
    """A fresh database on the test server for one module's project, dropped after."""
    from pipeline_output_tests.conftest import fresh_database

    yield from fresh_database(pg_url)


@contextlib.contextmanager
def instance(home: Path, url: str) -> Iterator[Any]:
    """The project's Dagster instance (`$PIPELINE_OUTPUT_HOME/dagster`), as its runs left it."""
    import dagster as dg

    from pipeline_output.infra.settings import DAGSTER_PG_URL, to_sqlalchemy_url

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DAGSTER_PG_URL, to_sqlalchemy_url(url, driver="psycopg2"))
        found = dg.DagsterInstance.from_config(str(home / "dagster"))
        try:
            yield found
        finally:
            found.dispose()


@contextlib.contextmanager
def catalog(home: Path, url: str) -> Iterator[Any]:
    """The project's Iceberg catalog (the default SQL catalog on the control plane)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from pipeline_output.infra.settings import to_sqlalchemy_url

    found = SqlCatalog(
        "default",
        uri=to_sqlalchemy_url(url, driver="psycopg"),
        warehouse=f"file://{home}/warehouse",
    )
    try:
        yield found
    finally:
        found.engine.dispose()


def meta(event: Any) -> dict[str, Any]:
    """An event's metadata as plain values."""
    record = event.asset_materialization or event.asset_observation
    return {k: getattr(v, "value", v) for k, v in record.metadata.items()}
