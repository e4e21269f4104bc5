"""The Dagster layer under Dagster's real execution: every demo dataset, dry runs, mode overrides,
range backfills, bad input and bad specs.

The demo shop is seeded into a fresh Postgres database, materialised (first deploy), ticked and
materialised again (re-deploy), then once more with no source change (no-op). Each Iceberg table is
compared with an independent oracle: the source tables read with plain psycopg and transformed with
plain polars/Python here, never with the demo's computes or the project's readers.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal
from psycopg import sql

from pipeline_output.infra.settings import Settings, to_sqlalchemy_url, with_database

NAMESPACE = "datasets"

# dataset -> (primary key used to sort, re-deploy write mode of its strategy)
DEMO: dict[str, tuple[str, str]] = {
    "customers": ("customer_id", "upsert"),  # snapshot_replace, delta
    "orders": ("order_id", "append_new"),  # append_new, delta
    "order_events": ("event_id", "append"),  # append_always, delta
    "daily_revenue": ("day", "replace"),  # replace, unpartitioned
    "active_products": ("product_id", "sync"),  # sync, unpartitioned
}
DELTA = ("customers", "orders", "order_events")
REQUIRED_METADATA = (
    "write_mode",
    "why",
    "mode",
    "arms",
    "dagster/row_count",
    "rows_inserted",
    "rows_updated",
    "rows_deleted",
    "rows_unchanged",
    "rows_skipped",
    "iceberg/snapshot_id",
    "dagster/table_name",
    "dagster/uri",
    "dagster/column_schema",
    "duration_s",
)


# --- plain readers and the oracle -----------------------------------------------------------------


def read_raw(url: str, table: str) -> pl.DataFrame:
    """A shop source table read with plain psycopg (not the project's ADBC reader)."""
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM shop.{}").format(sql.Identifier(table)))
        names = [d.name for d in cur.description or []]
        rows = cur.fetchall()
    return pl.DataFrame(rows, schema=names, orient="row", infer_schema_length=None)


def _utc(name: str, frame: pl.DataFrame) -> pl.Expr:
    dtype = frame.schema[name]
    assert isinstance(dtype, pl.Datetime)
    expr = pl.col(name)
    expr = expr.dt.replace_time_zone("UTC") if dtype.time_zone is None else expr
    return expr.dt.convert_time_zone("UTC").cast(pl.Datetime("us", "UTC"))


def _py_text(name: str, how: Any) -> pl.Expr:
    """Whitespace collapsed with Python's str.split, then `how` (str.title / lower / upper)."""
    return pl.col(name).map_elements(lambda s: how(" ".join(s.split())), return_dtype=pl.String)


def oracle(raw: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """What each demo table must hold after materialising everything in `raw`.

    Customers are never deleted and changed rows carry their latest version; orders and events are
    append-only; so every dataset's final contents are its transformation of the current source.
    """
    c = raw["raw_customers"]
    customers = c.select(
        pl.col("customer_id").cast(pl.Int64),
        _py_text("name", str.title).alias("name"),
        _py_text("email", str.lower).alias("email"),
        _py_text("country", str.upper).alias("country"),
        _py_text("segment", str.lower).alias("segment"),
        _utc("signup_at", c).alias("signup_at"),
        pl.col("updated_seq").cast(pl.Int64),
    )
    o = raw["raw_orders"]
    orders = o.select(
        pl.col("order_id").cast(pl.Int64),
        pl.col("customer_id").cast(pl.Int64),
        pl.col("product_id").cast(pl.Int64),
        pl.col("quantity").cast(pl.Int32),
        pl.col("amount").cast(pl.Decimal(12, 2)),
        _py_text("status", str.lower).alias("status"),
        _utc("ordered_at", o).alias("ordered_at"),
        _utc("ordered_at", o).dt.date().alias("order_date"),
        pl.col("seq").cast(pl.Int64),
    )
    e = raw["raw_order_events"]
    events = e.select(
        pl.col("event_id").cast(pl.Int64),
        pl.col("order_id").cast(pl.Int64),
        _py_text("event_type", str.lower).alias("event_type"),
        _utc("at", e).alias("at"),
        _utc("at", e).dt.date().alias("event_date"),
        pl.col("seq").cast(pl.Int64),
    )
    placed = orders.filter(pl.col("status") != "cancelled")
    revenue = (
        placed.group_by(pl.col("order_date").alias("day"))
        .agg(
            pl.col("amount").sum().cast(pl.Decimal(18, 2)).alias("revenue"),
            pl.col("order_id").n_unique().cast(pl.Int64).alias("orders"),
            pl.col("customer_id").n_unique().cast(pl.Int64).alias("customers"),
            pl.col("quantity").cast(pl.Int64).sum().alias("items"),
        )
        .with_columns(
            (pl.col("revenue").cast(pl.Float64) / pl.col("orders"))
            .round(2)
            .alias("avg_order_value")
        )
    )
    p = raw["raw_products"]
    products = p.filter(pl.col("active")).select(
        pl.col("product_id").cast(pl.Int64),
        _py_text("name", str).alias("name"),
        _py_text("category", str.lower).alias("category"),
        pl.col("price").cast(pl.Decimal(10, 2)),
        pl.col("updated_seq").cast(pl.Int64),
    )
    return {
        "customers": customers,
        "orders": orders,
        "order_events": events,
        "daily_revenue": revenue,
        "active_products": products,
    }


def key_diff(before: pl.DataFrame, after: pl.DataFrame, key: str) -> dict[str, int]:
    """Keys inserted / deleted / changed / unchanged between two versions of a keyed table."""
    joined = before.join(after, on=key, how="full", suffix="__a", coalesce=True)
    cols = [c for c in before.columns if c != key]
    same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(f"{c}__a")) for c in cols])
    inserted = after.join(before, on=key, how="anti").height
    deleted = before.join(after, on=key, how="anti").height
    both = joined.filter(
        pl.col(key).is_in(before[key].implode()) & pl.col(key).is_in(after[key].implode())
    )
    unchanged = both.filter(same).height
    return {
        "inserted": inserted,
        "deleted": deleted,
        "updated": both.height - unchanged,
        "unchanged": unchanged,
    }


def assert_same_rows(got: pl.DataFrame, expected: pl.DataFrame, key: str) -> None:
    """Same columns, types and rows (order-independent, sorted by `key`)."""
    assert sorted(got.columns) == sorted(expected.columns)
    assert_frame_equal(
        got.select(expected.columns).sort(key), expected.sort(key), check_dtypes=True
    )


# --- environment ----------------------------------------------------------------------------------


def open_catalog(db_url: str, home: Path) -> Any:
    """An independent pyiceberg handle on the project's SQL catalog (same name and warehouse)."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        "default",
        uri=to_sqlalchemy_url(db_url, driver="psycopg"),
        warehouse=f"file://{home}/warehouse",
    )


def iceberg_table(catalog: Any, name: str) -> tuple[pl.DataFrame, int | None]:
    """(contents, current snapshot id) of `datasets.<name>`."""
    catalog_table = catalog.load_table(f"{NAMESPACE}.{name}")
    frame = pl.from_arrow(catalog_table.scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    snap = catalog_table.current_snapshot()
    return frame, snap.snapshot_id if snap is not None else None


def meta_values(event: Any) -> dict[str, Any]:
    """Materialisation metadata as plain values (the raw MetadataValue kept for schemas)."""
    if isinstance(event, dg.DagsterEvent):
        meta = event.step_materialization_data.materialization.metadata
    else:
        meta = event.asset_materialization.metadata
    return {
        k: (v if k == "dagster/column_schema" else getattr(v, "value", v)) for k, v in meta.items()
    }


def latest_meta(instance: dg.DagsterInstance, name: str) -> dict[str, Any]:
    event = instance.get_latest_materialization_event(dg.AssetKey(name))
    assert event is not None, f"no materialisation of {name}"
    return meta_values(event)


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    """Every step failure's error message, with its cause chain, as one string."""
    parts = []
    for event in result.get_step_failure_events():
        error = event.event_specific_data.error  # type: ignore[union-attr]
        while error is not None:
            parts.append(error.message)
            error = error.cause
    return "\n".join(parts)


@dataclass
class Shop:
    """The demo materialised three times: seed, after a tick, and again with nothing new."""

    url: str
    home: Path
    raw: list[dict[str, pl.DataFrame]] = field(default_factory=list)
    meta: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    tables: list[dict[str, pl.DataFrame]] = field(default_factory=list)
    snapshots: list[dict[str, int | None]] = field(default_factory=list)
    run_ids: list[dict[str, str]] = field(default_factory=list)
    notes: list[dict[str, str]] = field(default_factory=list)  # the summary's note per asset


def _create_db(pg_url: str) -> tuple[str, str]:
    name = f"t{uuid.uuid4().hex[:12]}"
    admin = with_database(pg_url, database="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return admin, name


def _drop_db(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="module")
def shop(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    from pipeline_output.dagster_layer.resource import reset_runtime
    from pipeline_output.dagster_layer.runner import materialize
    from pipeline_output.demo import shop_data

    admin, name = _create_db(pg_url)
    url = with_database(pg_url, database=name)
    tmp = tmp_path_factory.mktemp("shop")
    with pytest.MonkeyPatch.context() as mp:
        for var in list(os.environ):
            if var.upper().startswith("PYICEBERG_") or var.startswith("PIPELINE_OUTPUT_"):
                mp.delenv(var)
        (tmp / "user-home").mkdir()
        mp.setenv("HOME", str(tmp / "user-home"))
        mp.chdir(tmp)
        mp.setenv("PIPELINE_OUTPUT_HOME", str(tmp / "home"))
        mp.setenv("PIPELINE_OUTPUT_PG_URL", url)
        reset_runtime()
        from pipeline_output.demo.code_location import defs

        state = Shop(url=url, home=tmp / "home")
        catalog = open_catalog(url, state.home)
        instance = dg.DagsterInstance.ephemeral()
        shop_data.seed(url)
        try:
            for round_no in range(3):
                if round_no == 1:
                    shop_data.tick(url)
                state.raw.append({t: read_raw(url, t) for t in shop_data.TABLES})
                report = materialize(defs, instance)
                assert report.ok, report.failures
                state.run_ids.append({r.asset: r.run_id for r in report.rows})
                state.notes.append({r.asset: r.note for r in report.rows})
                state.meta.append({ds: latest_meta(instance, ds) for ds in DEMO})
                tables, snaps = {}, {}
                for ds in DEMO:
                    tables[ds], snaps[ds] = iceberg_table(catalog, ds)
                state.tables.append(tables)
                state.snapshots.append(snaps)
            yield state
        finally:
            catalog.engine.dispose()
            reset_runtime()
            _drop_db(admin, name)


# --- every demo dataset: first deploy, re-deploy, no-op ------------------------------------------


@pytest.mark.parametrize("name", list(DEMO))
def test_first_materialisation_replaces_and_matches_the_oracle(shop: Shop, name: str) -> None:
    key, _ = DEMO[name]
    meta = shop.meta[0][name]
    expected = oracle(shop.raw[0])[name]
    assert meta["write_mode"] == "replace"
    assert meta["why"] == "first deploy"
    assert_same_rows(shop.tables[0][name], expected, key)
    assert meta["dagster/row_count"] == expected.height
    assert meta["rows_inserted"] == expected.height
    assert meta["iceberg/snapshot_id"] == str(shop.snapshots[0][name])


@pytest.mark.parametrize("name", list(DEMO))
def test_materialisation_after_a_tick_uses_the_strategys_redeploy_mode(
    shop: Shop, name: str
) -> None:
    key, redeploy = DEMO[name]
    meta = shop.meta[1][name]
    before, after = oracle(shop.raw[0])[name], oracle(shop.raw[1])[name]
    assert meta["write_mode"] == redeploy
    assert_same_rows(shop.tables[1][name], after, key)
    assert meta["dagster/row_count"] == after.height
    assert meta["iceberg/snapshot_id"] == str(shop.snapshots[1][name])
    assert shop.snapshots[1][name] != shop.snapshots[0][name]
    diff = key_diff(before, after, key)
    if name in DELTA:
        # One new window: exactly the source rows the tick added or changed.
        assert meta["windows_applied"] == 1
        assert meta["rows_in"] == diff["inserted"] + diff["updated"]
    else:
        assert meta["why"] == "re-deploy"
    if redeploy in ("upsert", "sync"):
        assert (meta["rows_inserted"], meta["rows_updated"]) == (diff["inserted"], diff["updated"])
        assert meta["rows_deleted"] == (diff["deleted"] if redeploy == "sync" else 0)
        assert diff["inserted"] > 0 and diff["updated"] > 0  # the tick really changed rows
    elif redeploy in ("append", "append_new"):
        assert meta["rows_inserted"] == diff["inserted"] > 0
        assert (meta["rows_updated"], meta["rows_deleted"], meta["rows_skipped"]) == (0, 0, 0)
    else:  # replace: every old row out, every new row in
        assert meta["rows_inserted"] == after.height
        assert meta["rows_deleted"] == before.height


@pytest.mark.parametrize("name", DELTA)
def test_a_window_write_says_why_is_the_window(shop: Shop, name: str) -> None:
    meta = shop.meta[1][name]
    applied = re.findall(r"(\([^\]]*\]) applied", str(meta["windows"]))
    assert len(applied) == 1, meta["windows"]
    assert meta["why"] == f"window {applied[0]}", meta["why"]


@pytest.mark.parametrize("name", list(DEMO))
@pytest.mark.parametrize("round_no", [0, 1], ids=["first", "redeploy"])
def test_materialisation_metadata_is_complete(shop: Shop, name: str, round_no: int) -> None:
    meta = shop.meta[round_no][name]
    missing = [k for k in REQUIRED_METADATA if k not in meta]
    assert not missing, f"{name}: metadata lacks {missing}; has {sorted(meta)}"
    assert meta["mode"] == "iceberg (from declared)"
    assert meta["arms"] == "iceberg"
    assert meta["dagster/table_name"] == f"default.{NAMESPACE}.{name}"
    assert meta["noop"] is False
    assert isinstance(meta["duration_s"], float) and meta["duration_s"] > 0
    schema = meta["dagster/column_schema"].schema
    assert [c.name for c in schema.columns] == shop.tables[round_no][name].columns


@pytest.mark.parametrize("name", list(DEMO))
def test_rematerialising_without_source_changes_is_a_reported_noop(shop: Shop, name: str) -> None:
    meta = shop.meta[2][name]
    assert_same_rows(shop.tables[2][name], oracle(shop.raw[2])[name], DEMO[name][0])
    if name == "daily_revenue":
        # `replace` rewrites the whole table each time; when it writes, it says so.
        assert meta["write_mode"] == "replace"
        assert meta["iceberg/snapshot_id"] == str(shop.snapshots[2][name])
        return
    assert shop.snapshots[2][name] == shop.snapshots[1][name], "a no-op committed a snapshot"
    if name in DELTA:
        # no pending window: no run at all, so every window partition keeps the figures of the
        # run that applied it (a run skipping applied windows would record itself on them)
        assert (shop.run_ids[2][name], shop.notes[2][name]) == ("-", "no pending window")
        assert meta == shop.meta[1][name]
        return
    assert "no-op" in str(meta.get("note")), meta
    assert meta["noop"] is True
    assert "iceberg/snapshot_id" not in meta


# --- dry run, mode override, range backfill ------------------------------------------------------


@pytest.fixture
def seeded(settings_env: Settings, pg_db_url: str) -> Iterator[tuple[str, Any]]:
    """The demo shop seeded into this test's database; (url, independent catalog)."""
    from pipeline_output.dagster_layer.resource import reset_runtime
    from pipeline_output.demo import shop_data

    reset_runtime()
    shop_data.seed(pg_db_url)
    catalog = open_catalog(pg_db_url, settings_env.home)
    yield pg_db_url, catalog
    catalog.engine.dispose()
    reset_runtime()


def _run(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    name: str,
    config: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_implicit_global_asset_job_def()
    run_config = {"ops": {name: {"config": config}}} if config else None
    return job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey(name)],
        run_config=run_config,
        raise_on_error=False,
        **kwargs,
    )


def _observations(result: dg.ExecuteInProcessResult) -> list[dict[str, Any]]:
    return [
        {
            k: getattr(v, "value", v)
            for k, v in e.asset_observation_data.asset_observation.metadata.items()
        }
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]


def test_dry_run_before_the_first_deploy_reports_replace_and_writes_nothing(
    seeded: tuple[str, Any],
) -> None:
    from pipeline_output.demo.code_location import defs

    _, catalog = seeded
    instance = dg.DagsterInstance.ephemeral()
    result = _run(defs, instance, "active_products", {"dry_run": True})
    assert result.success
    assert result.get_asset_materialization_events() == []
    [obs] = _observations(result)
    assert obs["dry_run"] is True
    assert obs["write_mode"] == "replace"
    assert obs["target_state"].startswith("first deploy")
    assert "replace every target row" in obs["expected_effect"]
    assert not catalog.table_exists(f"{NAMESPACE}.active_products")
    assert instance.get_latest_materialization_event(dg.AssetKey("active_products")) is None


def test_dry_run_after_a_deploy_reports_the_redeploy_plan_and_keeps_the_snapshot(
    seeded: tuple[str, Any],
) -> None:
    from pipeline_output.demo import shop_data
    from pipeline_output.demo.code_location import defs

    url, catalog = seeded
    instance = dg.DagsterInstance.ephemeral()
    assert _run(defs, instance, "active_products").success
    _, snapshot = iceberg_table(catalog, "active_products")
    n_snapshots = len(catalog.load_table(f"{NAMESPACE}.active_products").snapshots())
    shop_data.tick(url)
    result = _run(defs, instance, "active_products", {"dry_run": True})
    assert result.success
    assert result.get_asset_materialization_events() == []
    [obs] = _observations(result)
    assert (obs["write_mode"], obs["reason"], obs["target_state"]) == (
        "sync",
        "re-deploy",
        "re-deploy",
    )
    assert "delete target rows whose key is absent" in obs["expected_effect"]
    catalog_table = catalog.load_table(f"{NAMESPACE}.active_products")
    assert catalog_table.current_snapshot().snapshot_id == snapshot
    assert len(catalog_table.snapshots()) == n_snapshots
    records = instance.fetch_materializations(dg.AssetKey("active_products"), limit=10).records
    assert len(records) == 1


def test_dry_run_of_a_delta_window_plans_it_without_applying_it(seeded: tuple[str, Any]) -> None:
    from pipeline_output.dagster_layer.resource import get_runtime
    from pipeline_output.dagster_layer.runner import plan_windows
    from pipeline_output.demo.code_location import defs

    _, catalog = seeded
    instance = dg.DagsterInstance.ephemeral()
    plan_windows(defs, instance)
    [key] = instance.get_dynamic_partitions("orders__windows")
    result = _run(defs, instance, "orders", {"dry_run": True}, partition_key=key)
    assert result.success
    assert result.get_asset_materialization_events() == []
    [obs] = _observations(result)
    assert obs["write_mode"] == "replace" and obs["reason"] == "first deploy"
    assert not catalog.table_exists(f"{NAMESPACE}.orders")
    [window] = get_runtime().windows.windows("orders")
    assert window.state == "planned"


def test_mode_override_pg_uses_the_legacy_arm_or_fails_clearly_when_it_is_missing(
    seeded: tuple[str, Any],
) -> None:
    from pipeline_output.dagster_layer.resource import get_runtime
    from pipeline_output.demo.code_location import defs

    _, catalog = seeded
    instance = dg.DagsterInstance.ephemeral()
    result = _run(defs, instance, "active_products", {"mode": "pg"})
    # Never a write to the other arm: Iceberg stays untouched whatever the legacy arm does.
    assert not catalog.table_exists(f"{NAMESPACE}.active_products")
    if get_runtime().publisher.postgres is None:
        assert not result.success
        text = failure_text(result)
        assert "'active_products'" in text and "not available" in text, text
        assert result.get_asset_materialization_events() == []
    else:
        assert result.success, failure_text(result)
        meta = latest_meta(instance, "active_products")
        assert meta["arms"] == "pg"
        assert meta["mode"] == "pg (from run config)"
        assert meta["write_mode"] == "replace"


def test_unknown_mode_override_fails_the_run_naming_the_dataset(seeded: tuple[str, Any]) -> None:
    from pipeline_output.demo.code_location import defs

    _, catalog = seeded
    result = _run(defs, dg.DagsterInstance.ephemeral(), "active_products", {"mode": "parquet"})
    assert not result.success
    text = failure_text(result)
    assert "'active_products'" in text and "unknown mode 'parquet'" in text, text
    assert not catalog.table_exists(f"{NAMESPACE}.active_products")


def test_single_run_backfill_applies_a_range_of_windows_in_order(
    seeded: tuple[str, Any],
) -> None:
    from pipeline_output.dagster_layer.resource import get_runtime
    from pipeline_output.dagster_layer.runner import plan_windows
    from pipeline_output.demo import shop_data
    from pipeline_output.demo.code_location import defs

    url, catalog = seeded
    instance = dg.DagsterInstance.ephemeral()
    plan_windows(defs, instance)
    for _ in range(2):
        shop_data.tick(url)
        plan_windows(defs, instance)
    expected = oracle({t: read_raw(url, t) for t in shop_data.TABLES})
    job = defs.resolve_implicit_global_asset_job_def()
    for name in ("customers", "orders"):
        keys = instance.get_dynamic_partitions(f"{name}__windows")
        assert len(keys) == 3
        ordered = sorted(keys)
        result = job.execute_in_process(
            instance=instance,
            asset_selection=[dg.AssetKey(name)],
            tags={
                "dagster/asset_partition_range_start": ordered[0],
                "dagster/asset_partition_range_end": ordered[-1],
            },
            raise_on_error=False,
        )
        assert result.success, failure_text(result)
        events = result.get_asset_materialization_events()
        assert sorted(e.partition for e in events) == ordered
        meta = meta_values(events[-1])
        assert meta["windows_applied"] == 3
        assert_same_rows(iceberg_table(catalog, name)[0], expected[name], DEMO[name][0])
        assert {w.state for w in get_runtime().windows.windows(name)} == {"applied"}


# --- bad input at this layer ---------------------------------------------------------------------


@pytest.fixture
def people(settings_env: Settings, pg_db_url: str) -> Iterator[Any]:
    """Table public.people (10 rows) in the test database; yields an independent catalog."""
    from pipeline_output.dagster_layer.resource import reset_runtime

    reset_runtime()
    with psycopg.connect(pg_db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.people (id bigint PRIMARY KEY, name text, seq bigint)")
        conn.execute(
            "INSERT INTO public.people SELECT g, 'p' || g, g FROM generate_series(1, 10) g"
        )
    catalog = open_catalog(pg_db_url, settings_env.home)
    yield catalog
    catalog.engine.dispose()
    reset_runtime()


def _defs_with(compute: Any, *, source_table: str = "people") -> dg.Definitions:
    from pipeline_output import build_definitions, dataset, postgres_source

    src = postgres_source("people_src", table=source_table)
    asset = dataset("roster", primary_key="id", mode="iceberg")(compute)
    return build_definitions(datasets=[asset], sources=[src])


def _good(people_src: pl.LazyFrame) -> pl.LazyFrame:
    return people_src.select("id", "name")


def _wrong_type(people_src: pl.LazyFrame) -> Any:
    return people_src.collect().to_dicts()


def _no_key(people_src: pl.LazyFrame) -> pl.LazyFrame:
    return people_src.select("name")


@pytest.mark.parametrize(
    ("compute", "cause"),
    [
        (_wrong_type, "the compute returned list"),
        (_no_key, "primary-key column(s) ['id'] missing"),
    ],
    ids=["wrong_type", "missing_key_column"],
)
def test_bad_compute_output_fails_the_run_naming_dataset_and_cause_and_writes_nothing(
    people: Any, compute: Any, cause: str
) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = _run(_defs_with(compute), instance, "roster")
    assert not result.success
    text = failure_text(result)
    assert "'roster'" in text and cause in text, text
    assert not people.table_exists(f"{NAMESPACE}.roster")
    assert instance.get_latest_materialization_event(dg.AssetKey("roster")) is None


@pytest.mark.parametrize("compute", [_wrong_type, _no_key], ids=["wrong_type", "missing_key"])
def test_bad_compute_output_on_redeploy_keeps_the_committed_snapshot(
    people: Any, compute: Any
) -> None:
    instance = dg.DagsterInstance.ephemeral()
    assert _run(_defs_with(_good), instance, "roster").success
    before, snapshot = iceberg_table(people, "roster")
    result = _run(_defs_with(compute), instance, "roster")
    assert not result.success
    assert "'roster'" in failure_text(result)
    after, snapshot_after = iceberg_table(people, "roster")
    assert snapshot_after == snapshot
    assert_frame_equal(after.sort("id"), before.sort("id"))


def test_a_delta_compute_that_raises_says_which_window_it_was_computing(people: Any) -> None:
    from pipeline_output import Delta, build_definitions, dataset, postgres_source
    from pipeline_output.dagster_layer.runner import plan_windows

    def roster(people_src: pl.LazyFrame) -> pl.LazyFrame:
        raise ValueError("no roster today")

    src = postgres_source("people_src", table="people")
    asset = dataset(
        "roster",
        primary_key="id",
        mode="iceberg",
        delta=Delta(source="people_src", watermark="seq"),
    )(roster)
    defs = build_definitions(datasets=[asset], sources=[src], with_maintenance=False)
    instance = dg.DagsterInstance.ephemeral()
    plan_windows(defs, instance)
    (key,) = instance.get_dynamic_partitions("roster__windows")
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey("roster")],
        partition_key=key,
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error = failure.step_failure_data.error
    while error.cause is not None:
        error = error.cause
    assert error.cls_name == "ValueError"
    assert "no roster today" in error.message
    assert "(computing window (-inf, 10] of dataset 'roster')" in error.message, error.message
    assert not people.table_exists(f"{NAMESPACE}.roster")


def test_missing_source_table_fails_the_run_naming_dataset_source_and_table(people: Any) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = _run(_defs_with(_good, source_table="no_such_table"), instance, "roster")
    assert not result.success
    text = failure_text(result)
    # one line names the dataset whose input failed, the source and the missing table
    assert text.startswith("dagster._core.definitions.events.Failure: dataset 'roster': "), text
    assert "'people_src'" in text and "public.no_such_table does not exist" in text, text
    assert not people.table_exists(f"{NAMESPACE}.roster")


# --- bad specs fail at definition time -----------------------------------------------------------


def _compute(people_src: pl.LazyFrame) -> pl.LazyFrame:
    return people_src


@pytest.mark.parametrize(
    ("options", "name", "cause"),
    [
        ({"strategy": "sync"}, "synced", "strategy 'sync' needs a primary_key"),
        ({"strategy": "append_new"}, "fresh_only", "needs a primary_key"),
        ({"primary_key": "id", "strategy": "upsert_all"}, "bad_strategy", "unknown strategy"),
        ({"primary_key": "id", "mode": "parquet"}, "bad_mode", "unknown mode 'parquet'"),
        ({"primary_key": "bad key"}, "bad_key", "primary-key column 'bad key'"),
        ({}, "bad-name", "dataset name 'bad-name' is not a valid identifier"),
    ],
    ids=["sync_without_key", "append_new_without_key", "strategy", "mode", "key_column", "name"],
)
def test_bad_dataset_spec_fails_at_definition_time_naming_the_dataset(
    options: dict[str, Any], name: str, cause: str
) -> None:
    from pipeline_output import dataset
    from pipeline_output.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as info:
        dataset(name, **options)(_compute)
    assert f"'{name}'" in str(info.value) and cause in str(info.value)


@pytest.mark.parametrize(
    ("given", "ours"),
    [("upsert", "snapshot_replace"), ("merge", "snapshot_replace"), ("append", "append_always")],
)
def test_a_strategy_named_as_other_tools_name_it_fails_in_one_line_naming_ours(
    given: str, ours: str
) -> None:
    from pipeline_output import dataset
    from pipeline_output.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as info:
        dataset("orders", primary_key="id", strategy=given)(_compute)  # type: ignore[arg-type]
    text = str(info.value)
    # where it is declared, the dataset once, and the strategy to use instead
    assert text.startswith(f"@dataset 'orders' ({__name__}): unknown strategy {given!r}; "), text
    assert text.count("'orders'") == 1 and f"for {given!r} use {ours!r}" in text, text
    assert info.value.__cause__ is None and info.value.__suppress_context__, "one error, no chain"


def test_dataset_partition_by_defaults_to_not_said_and_keeps_an_empty_one() -> None:
    from pipeline_output import dataset
    from pipeline_output.dagster_layer.dataset import spec_of

    said_nothing = spec_of(dataset("plain", primary_key="id")(_compute))
    unpartitioned = spec_of(dataset("flat", primary_key="id", partition_by=())(_compute))
    assert said_nothing is not None and said_nothing.partition_by is None
    assert unpartitioned is not None and unpartitioned.partition_by == ()


def test_delta_over_a_source_the_compute_does_not_take_fails_at_definition_time() -> None:
    from pipeline_output import dataset
    from pipeline_output.contract.spec import Delta
    from pipeline_output.errors import InvalidSpec

    with pytest.raises(InvalidSpec, match=r"'windowed'.*Delta\(source='elsewhere'\)"):
        dataset("windowed", primary_key="id", delta=Delta(source="elsewhere", watermark="seq"))(
            _compute
        )


def test_bad_postgres_source_fails_at_definition_time_naming_the_source() -> None:
    from pipeline_output import postgres_source
    from pipeline_output.errors import InvalidSpec

    with pytest.raises(InvalidSpec, match=r"'raw_people'.*source table 'people; drop'"):
        postgres_source("raw_people", table="people; drop")
