"""Time-zoned watermarks end to end (issue 17, items 1 and 2).

The database's `TimeZone` is set to something other than UTC (`ALTER DATABASE ... SET timezone`),
the source's watermark is `timestamptz` or `timestamp`, and the whole delta path runs on real parts:
the window sensor (two ticks: the second one used to crash comparing a naive ledger bound with an
aware high-water mark), two windows, a restatement with a deleted and an updated row, and then the
stores read and sync-write the window decoded from its partition key. Expected contents come from
the source table itself (an independent oracle), compared as UTC instants.

A window whose read comes back empty although the source holds rows in its range must fail, not be
recorded as applied: `test_a_window_read_that_loses_its_rows_fails_and_stays_unapplied`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from psycopg import sql

from pipeline_output import Delta, Window, build_definitions, dataset, postgres_source
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.delta_assets import WindowReader
from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime
from pipeline_output.errors import EmptyWindowRead
from pipeline_output_tests.oracle import assert_same_multiset

BASE = datetime(2026, 3, 1, 0, 30, tzinfo=UTC)


@pytest.fixture
def zoned_env(
    settings_env: Any, pg_db_url: str, server_tz: str, set_server_zone: Callable[[str], None]
) -> Iterator[str]:
    set_server_zone(server_tz)
    with psycopg.connect(pg_db_url) as conn:
        shown = conn.execute("SHOW timezone").fetchone()
    assert shown is not None and shown[0] == server_tz, "the server zone did not take"
    reset_runtime()
    get_runtime()
    yield pg_db_url
    reset_runtime()


def _value(kind: str, hours: int) -> datetime:
    """The i-th watermark value: aware for timestamptz, naive (UTC wall clock) for timestamp."""
    at = BASE + timedelta(hours=hours)
    return at if kind == "timestamptz" else at.replace(tzinfo=None)


def make_source(url: str, kind: str, hours: list[int]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS ev")
        conn.execute(
            sql.SQL("CREATE TABLE ev (id bigint PRIMARY KEY, v text NOT NULL, ts {})").format(
                sql.SQL(kind)
            )
        )
    add_rows(url, kind, hours, start_id=1)


def add_rows(url: str, kind: str, hours: list[int], *, start_id: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO ev (id, v, ts) VALUES (%s, %s, %s)",
            [(start_id + i, f"v{start_id + i}", _value(kind, h)) for i, h in enumerate(hours)],
        )


def _instant_us(value: datetime) -> int:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return round(aware.timestamp() * 1_000_000)


def source_oracle(url: str, window: Window | None = None) -> pl.DataFrame:
    """The source's rows (id, v, ts as UTC epoch microseconds), read independently with psycopg
    in whatever zone the server gives this session, optionally only `low < ts <= high`."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, v, ts FROM ev ORDER BY id").fetchall()
    out = [(i, v, _instant_us(ts)) for i, v, ts in rows]
    if window is not None:
        low = None if window.low is None else _instant_us(window.low)  # type: ignore[arg-type]
        high = None if window.high is None else _instant_us(window.high)  # type: ignore[arg-type]
        out = [r for r in out if (low is None or r[2] > low) and (high is None or r[2] <= high)]
    return pl.DataFrame(
        out, schema={"id": pl.Int64, "v": pl.String, "ts_us": pl.Int64}, orient="row"
    )


def as_instants(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select("id", "v", pl.col("ts").dt.epoch("us").alias("ts_us"))


def zoned_defs(mode: str) -> dg.Definitions:
    raw = postgres_source("ev", table="ev", watermark="ts")

    def compute(ev: pl.LazyFrame) -> pl.DataFrame:
        return ev.select("id", "v", "ts").collect()

    asset = dataset(
        "ev_copy",
        primary_key=("id",),
        strategy="sync",
        mode=mode,  # type: ignore[arg-type]
        delta=Delta(source="ev", watermark="ts"),
    )(compute)
    return build_definitions(datasets=[asset], sources=[raw])


def tick(defs: dg.Definitions, instance: dg.DagsterInstance) -> list[str]:
    sensor = defs.get_sensor_def("ev_copy__window_sensor")
    result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    assert isinstance(result, dg.SensorResult)
    keys: list[str] = []
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        keys.extend(req.partition_keys)
    return keys


def run_window(
    defs: dg.Definitions, instance: dg.DagsterInstance, key: str, *, restate: bool = False
) -> dict[str, Any]:
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        instance=instance,
        partition_key=key,
        asset_selection=[dg.AssetKey("ev_copy")],
        run_config={"ops": {"ev_copy": {"config": {"restate": True}}}} if restate else None,
    )
    events = result.get_asset_materialization_events()
    assert events, "the run recorded no materialisation"
    meta = events[-1].materialization.metadata
    out = {k: getattr(v, "value", v) for k, v in meta.items()}
    return out


def arms(mode: str) -> list[str]:
    return ["iceberg", "pg"] if mode == "dual" else [mode]


def read_arm(arm: str, *, window: Window | None = None) -> pl.DataFrame:
    runtime = get_runtime()
    store: Any = runtime.iceberg if arm == "iceberg" else runtime.postgres
    if window is None:
        return store.read("ev_copy")
    return store.read("ev_copy", window=window, watermark="ts")


@pytest.mark.parametrize("server_tz", ["UTC", "Asia/Tokyo"])
@pytest.mark.parametrize("kind", ["timestamptz", "timestamp"])
@pytest.mark.parametrize("mode", ["iceberg", "dual"])
def test_zoned_watermark_windows_apply_every_row_through_sensor_and_restatement(
    zoned_env: str, instance: dg.DagsterInstance, server_tz: str, kind: str, mode: str
) -> None:
    url = zoned_env
    make_source(url, kind, list(range(10)))
    defs = zoned_defs(mode)

    first = tick(defs, instance)
    assert len(first) == 1
    meta = run_window(defs, instance, first[0])
    assert meta["rows_in"] == 10, f"window {first[0]} applied {meta['rows_in']} of 10 rows"
    for arm in arms(mode):
        assert_same_multiset(as_instants(read_arm(arm)), source_oracle(url))

    add_rows(url, kind, [20, 21, 22, 23, 24], start_id=11)
    second = tick(defs, instance)  # used to raise TypeError (naive ledger high vs aware hwm)
    assert len(second) == 1 and second[0] != first[0]
    meta = run_window(defs, instance, second[0])
    assert meta["rows_in"] == 5
    for arm in arms(mode):
        assert_same_multiset(as_instants(read_arm(arm)), source_oracle(url))

    # a late correction inside window 1: one row deleted, one updated, then the restatement
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM ev WHERE id = 3")
        conn.execute("UPDATE ev SET v = 'changed' WHERE id = 4")
    run_window(defs, instance, first[0], restate=True)
    assert tick(defs, instance) == [], "no new rows, no new window"
    for arm in arms(mode):
        got = as_instants(read_arm(arm))
        assert_same_multiset(got, source_oracle(url))
        for key in (first[0], second[0]):
            window = Window.from_key(key)
            part = as_instants(read_arm(arm, window=window))  # "Missing zone offset" before
            assert_same_multiset(part, source_oracle(url, window))


@pytest.mark.parametrize("server_tz", ["Asia/Tokyo"])
@pytest.mark.parametrize("kind", ["timestamptz", "timestamp"])
@pytest.mark.parametrize("arm", ["iceberg", "pg"])
def test_windowed_sync_with_bounds_from_a_partition_key_deletes_only_inside_the_window(
    zoned_env: str, server_tz: str, kind: str, arm: str
) -> None:
    """Bounds decoded from a key reach the store's windowed sync (polars SchemaError before)."""
    runtime = get_runtime()
    store: Any = runtime.iceberg if arm == "iceberg" else runtime.postgres
    spec = DatasetSpec(
        "ev_copy", primary_key=("id",), strategy="sync", delta=Delta(source="ev", watermark="ts")
    )
    rows = pl.DataFrame(
        {
            "id": list(range(1, 11)),
            "v": [f"v{i}" for i in range(1, 11)],
            "ts": [_value(kind, h) for h in range(10)],
        }
    )
    window = Window.from_key(Window(_value(kind, 3), _value(kind, 6)).to_key())
    inside = rows.filter(pl.col("id").is_in([5, 6]))  # ids 5-7 are in the window; 7 is absent
    for _ in range(2):  # every write twice: re-runs are safe
        store.write(spec, rows)
        store.write(spec, inside.with_columns(v=pl.lit("new")), window=window)
        got = store.read("ev_copy").sort("id")
        expected = [1, 2, 3, 4, 5, 6, 8, 9, 10]
        assert got["id"].to_list() == expected, f"window {window} on {arm}"
        assert got.filter(pl.col("id").is_in([5, 6]))["v"].to_list() == ["new", "new"]


@pytest.mark.parametrize("server_tz", ["Asia/Tokyo"])
def test_a_chain_of_naive_keys_continues_with_utc_keys_after_upgrade(
    zoned_env: str, instance: dg.DagsterInstance, server_tz: str
) -> None:
    """Ledgers written before aware bounds kept their zone hold naive keys for timestamptz
    watermarks; the next window continues the chain instead of failing on a gap."""
    url = zoned_env
    make_source(url, "timestamptz", list(range(10)))
    defs = zoned_defs("iceberg")
    old_high = (BASE + timedelta(hours=4)).replace(tzinfo=None)
    old_key = Window(None, old_high).to_key()
    assert not old_key.endswith("Z")
    get_runtime().windows.plan("ev_copy", [Window.from_key(old_key)])
    instance.add_dynamic_partitions("ev_copy__windows", [old_key])
    run_window(defs, instance, old_key)
    keys = tick(defs, instance)
    assert len(keys) == 1 and keys[0].endswith("Z"), keys
    assert Window.from_key(keys[0]).low == BASE + timedelta(hours=4)
    run_window(defs, instance, keys[0])
    assert_same_multiset(as_instants(read_arm("iceberg")), source_oracle(url))


def test_a_window_read_that_loses_its_rows_fails_and_stays_unapplied() -> None:
    """The guard itself: a read that comes back empty while the source counts rows raises."""
    window = Window(BASE, BASE + timedelta(hours=2))
    empty = pl.DataFrame({"ts": pl.Series([], dtype=pl.Datetime("us", "UTC"))}).lazy()
    reader = WindowReader("ev", lambda w: empty, count=lambda w: 3)
    reader.scan(window).collect()
    with pytest.raises(EmptyWindowRead, match=r"'ev_copy'.*returned 0 rows.*3 row"):
        reader.check_read(window, dataset="ev_copy")
    held = pl.DataFrame({"ts": [BASE + timedelta(hours=1)]}).lazy()
    ok = WindowReader("ev", lambda w: held, count=lambda w: 1)
    ok.scan(window).filter(pl.lit(False)).collect()  # the compute's own filter may drop all
    ok.check_read(window, dataset="ev_copy")
    truly_empty = WindowReader("ev", lambda w: empty, count=lambda w: 0)
    truly_empty.scan(window).collect()
    truly_empty.check_read(window, dataset="ev_copy")
