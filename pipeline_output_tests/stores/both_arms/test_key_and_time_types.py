"""Issue 16, items 3 and 5: which column types can be a primary key, and raw third-party errors.

3. A float/double or nested (struct, list, array) primary-key column is refused by both arms alike:
   `BadInput` naming the dataset, the column, its type and why, at the first write and before any
   I/O (no Iceberg table is created, no `pg` deploy recorded). One rule, declared once
   (`Capabilities.key_types`, the same `KEY_TYPES` on both arms): Iceberg identifier fields cannot
   be float, double or nested, and a float is no exact key anyway (NaN, -0.0, rounding), so a
   dataset the legacy arm accepted could not be flipped to Iceberg.
5. A null into a required (NOT NULL) column of an Iceberg table created outside the project is
   `BadInput` naming the dataset and the column, raised before any data file is written (it was
   pyarrow's `ValueError: Casting field ... to non-nullable`); a polars `Time` column is stored by
   both arms (Iceberg `time`, Postgres `time`: microseconds, finer digits truncated) and reads back
   as `Time` (it was `UnsupportedPyArrowTypeException: time64[ns]` on Iceberg, `BadInput` on pg).

Real Postgres and a real pyiceberg SQL catalog; no mocks. Round trips are checked against the
independent polars oracle through `arms.py`, each write run twice (the re-run changes nothing).
"""

from __future__ import annotations

from datetime import date, time
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimeType

from pipeline_output import DatasetSpec, IcebergStore, PostgresStore
from pipeline_output.errors import BadInput
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.infra.settings import to_sqlalchemy_url, with_database
from pipeline_output.ledger import Ledger
from pipeline_output.services.publish import Publisher, ResolvedMode
from pipeline_output.stores.iceberg.write.merge import ICEBERG_CAPABILITIES
from pipeline_output.stores.postgres.staging import LEGACY_CAPABILITIES
from pipeline_output.stores.postgres.types import staged_type
from pipeline_output_tests.iceberg_harness import NS, Harness
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.stores.arms import IcebergArm, PgArm, PgHarness

KEYED = ("snapshot_replace", "append_new", "sync", "replace", "append_always")


def _parquet_files(warehouse: str) -> set[Path]:
    return set(Path(warehouse.removeprefix("file://")).rglob("*.parquet"))


# --- item 3: float and nested primary keys ---------------------------------------------------------

BAD_KEYS: dict[str, tuple[pl.Series, str]] = {
    "float64": (pl.Series("k", [1.5, 2.5], dtype=pl.Float64), "float"),
    "float32": (pl.Series("k", [1.5, 2.5], dtype=pl.Float32), "float"),
    "struct": (pl.Series("k", [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]), "nested"),
    "list": (pl.Series("k", [[1, 2], [3]]), "nested"),
    "array": (pl.Series("k", [[1, 2], [3, 4]], dtype=pl.Array(pl.Int64, 2)), "nested"),
}


def test_both_arms_declare_the_same_key_types_and_no_float_or_nested_one() -> None:
    from pipeline_output.contract.store_protocol import KEY_TYPES

    assert ICEBERG_CAPABILITIES.key_types == LEGACY_CAPABILITIES.key_types == KEY_TYPES
    for dtype in (pl.Float32(), pl.Float64(), pl.Struct({"a": pl.Int64}), pl.List(pl.Int64)):
        assert not isinstance(dtype, KEY_TYPES), dtype
    for dtype in (pl.Int32(), pl.Int64(), pl.String(), pl.Date(), pl.Time(), pl.Decimal(10, 2)):
        assert isinstance(dtype, KEY_TYPES), dtype


@pytest.mark.parametrize("strategy", KEYED)
@pytest.mark.parametrize("kind", list(BAD_KEYS))
def test_a_float_or_nested_primary_key_is_refused_alike_on_both_arms_before_any_io(
    h: IcebergArm | PgArm, arm: str, kind: str, strategy: str
) -> None:
    key, why = BAD_KEYS[kind]
    spec = DatasetSpec(name=f"bad_key_{kind}", primary_key=("k",), strategy=strategy)  # type: ignore[arg-type]
    frame = pl.DataFrame([key, pl.Series("v", [1, 2])])
    for _ in range(2):  # refused every time, not only the first
        with pytest.raises(BadInput) as err:
            h.write(spec, frame)
        assert not h.has_commit(spec)
        msg = str(err.value)
        assert f"dataset {spec.name!r}" in msg and "primary-key column 'k'" in msg, msg
        assert str(frame.schema["k"]) in msg and why in msg and "nothing was written" in msg, msg
        assert "pydantic" not in msg.lower() and "Identifier field" not in msg, msg
    if arm == "iceberg":
        assert h.footprint(spec) == (False, [], []), "no table may be created"
    else:
        assert h.footprint(spec) == ([], None, []), "no deploy, no registration, no rows"


@pytest.mark.parametrize("kind", ["float64", "struct"])
def test_a_bad_key_type_is_refused_without_touching_storage_at_all(
    other_db_url: str, catalog_warehouse: str, kind: str
) -> None:
    """Both arms refuse before their first I/O: their catalog and database are gone (dropped,
    not mocked), so any query would fail with a connection error instead."""
    catalog = SqlCatalog(
        "gone", uri=to_sqlalchemy_url(other_db_url, driver="psycopg"), warehouse=catalog_warehouse
    )
    catalog.engine.dispose()
    with psycopg.connect(other_db_url) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        name = row[0]
    with psycopg.connect(with_database(other_db_url, database="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
    stores = [
        IcebergStore(catalog, NS, lock=AdvisoryLock(other_db_url)),
        PostgresStore(other_db_url),
    ]
    spec = DatasetSpec(name="unreachable", primary_key=("k",))
    key, why = BAD_KEYS[kind]
    frame = pl.DataFrame([key, pl.Series("v", [1, 2])])
    for store in stores:
        with pytest.raises(BadInput, match=why):
            store.write(spec, frame)
        with pytest.raises(Exception, match=name) as err:  # the control: storage is unreachable
            store.write(spec, frame.with_columns(k=pl.Series([1, 2])))
        assert not isinstance(err.value, BadInput)


def test_one_float_column_of_a_composite_key_is_named(h: IcebergArm | PgArm) -> None:
    spec = DatasetSpec(name="composite_float", primary_key=("id", "score"))
    frame = pl.DataFrame({"id": [1, 2], "score": [0.1, 0.2], "v": ["a", "b"]})
    with pytest.raises(BadInput, match=r"primary-key column 'score' has type Float64"):
        h.write(spec, frame)
    assert not h.has_commit(spec)


def test_a_float_key_in_dual_mode_is_refused_before_either_arm_does_io(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, catalog_warehouse: str
) -> None:
    h = Harness(catalog, fresh_catalog, pg_db_url)
    pg = PgHarness(pg_db_url)
    ledger = Ledger(pg_db_url)
    publisher = Publisher(iceberg=h.store(), postgres=pg.store(), ledger=ledger)
    spec = DatasetSpec(name="dual_float", primary_key=("k",))
    frame = pl.DataFrame({"k": [1.0, 2.0], "v": [1, 2]})
    with pytest.raises(BadInput, match=r"dataset 'dual_float': primary-key column 'k'"):
        publisher.publish(spec, frame, mode=ResolvedMode("dual", "run config"))
    assert not catalog.table_exists((NS, spec.name))
    assert _parquet_files(catalog_warehouse) == set()
    assert pg.store().schema(spec) is None and pg.deploy_ids(spec) == []


def test_float_values_and_a_float_dedupe_by_column_still_work_on_both_arms(
    h: IcebergArm | PgArm,
) -> None:
    """The rule is about key columns only: floats elsewhere (`dedupe_by` included) are stored."""
    spec = DatasetSpec(name="float_values", primary_key=("id",), dedupe_by="score")
    frame = pl.DataFrame({"id": [1, 1, 2], "score": [0.5, 0.25, 1.5], "v": ["a", "b", "c"]})
    expected = pl.DataFrame({"id": [1, 2], "score": [0.5, 1.5], "v": ["a", "c"]})
    for _ in range(2):
        h.write(spec, frame)
        assert_same_multiset(h.rows(spec), expected)


# --- item 5.1: null into a required column of a table created outside the project ------------------


def _outside_table(catalog: Any, name: str, *, with_rows: bool) -> Any:
    """A table made with plain pyiceberg: `id` and `name` required (NOT NULL), `note` optional."""
    table = catalog.create_table(
        (NS, name),
        schema=Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "name", StringType(), required=True),
            NestedField(3, "note", StringType(), required=False),
            identifier_field_ids=[1],
        ),
    )
    if with_rows:
        schema = pa.schema(
            [
                pa.field("id", pa.int64(), nullable=False),
                pa.field("name", pa.large_string(), nullable=False),
                pa.field("note", pa.large_string()),
            ]
        )
        table.append(pa.table({"id": [1, 2], "name": ["a", "b"], "note": [None, "n"]}, schema))
    return catalog.load_table((NS, name))


@pytest.mark.parametrize("with_rows", [True, False], ids=["has-rows", "no-snapshot"])
@pytest.mark.parametrize("strategy", KEYED)
@pytest.mark.parametrize("bad", ["null", "missing"])
def test_a_null_into_a_required_column_of_an_outside_table_is_bad_input_and_writes_nothing(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, strategy: str, with_rows: bool, bad: str
) -> None:
    h = IcebergArm(Harness(catalog, fresh_catalog, pg_db_url))
    spec = DatasetSpec(name="outside", primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    table = _outside_table(catalog, spec.name, with_rows=with_rows)
    before = h.footprint(spec)
    rows = h.iceberg.store().read(spec) if with_rows else None
    frame = pl.DataFrame({"id": [2, 3], "name": ["b2", None], "note": ["x", None]})
    if bad == "missing":
        frame = frame.drop("name")
    for _ in range(2):
        with pytest.raises(BadInput) as err:
            h.write(spec, frame)
        msg = str(err.value)
        assert "dataset 'outside'" in msg and "column 'name'" in msg, msg
        assert "required" in msg and "nothing was written" in msg, msg
        assert ("1 row" in msg) if bad == "null" else ("missing" in msg), msg
        assert "Casting field" not in msg, msg
        assert h.footprint(spec) == before, "no data file, no snapshot"
    if rows is not None:
        assert_same_multiset(h.iceberg.store().read(spec), rows)
    # rows that fill the required columns are written into the same table, twice
    good = frame.with_columns(name=pl.lit("filled"))
    for _ in range(2):
        h.write(spec, good)
    got = h.iceberg.store().read(spec)
    assert got.filter(pl.col("id") == 3)["name"].to_list()[-1] == "filled"
    assert catalog.load_table((NS, spec.name)).schema().find_field("name").required
    assert table.metadata.table_uuid == catalog.load_table((NS, spec.name)).metadata.table_uuid


# --- item 5.2: the time type -----------------------------------------------------------------------


def _times(ids: list[int], *, version: int = 0) -> pl.DataFrame:
    values = [
        time(0, 0),
        time(1, 2, 3, 456789),
        None,
        time(23, 59, 59, 999999),
        time(12, 0, 0, 1),
        time(6, 30),
    ]
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "at": pl.Series([values[(i + version) % len(values)] for i in ids], dtype=pl.Time),
            "day": [date(2024, 1, 1)] * len(ids),
        }
    )


def test_a_time_column_round_trips_on_both_arms_and_an_upsert_rerun_is_a_noop(
    h: IcebergArm | PgArm, arm: str
) -> None:
    spec = DatasetSpec(name="times", primary_key=("id",), strategy="snapshot_replace")
    first = _times(list(range(6)))
    for n in range(2):
        res, _ = h.write_and_check(spec, first, run_id=f"first{n}")  # second run: a no-op
        assert (res.snapshot_id is None) is (n == 1)
    # 3..5 change their time, 6..8 are new, 0..2 are kept: again twice, the re-run a no-op
    second = pl.concat([_times([0, 1, 2]), _times([3, 4, 5, 6, 7, 8], version=1)])
    for n in range(2):
        res, _ = h.write_and_check(spec, second, run_id=f"second{n}")
        assert (res.rows_updated, res.rows_inserted) == ((3, 3) if n == 0 else (0, 0))
        assert (res.snapshot_id is None) is (n == 1)
    got = h.read(spec)
    assert got.schema["at"] == pl.Time
    if arm == "iceberg":
        assert isinstance(h.iceberg.table(spec).schema().find_field("at").field_type, TimeType)
    else:
        assert staged_type(spec.name, "at", pl.Time()).as_string(None) == "time"
        assert {d["at"] for d in h.pg.raw_docs(spec)} >= {"01:02:03.456789", "23:59:59.999999"}


@pytest.mark.parametrize("strategy", ["snapshot_replace", "append_new", "sync"])
def test_a_time_primary_key_works_on_both_arms(h: IcebergArm | PgArm, strategy: str) -> None:
    spec = DatasetSpec(name="time_key", primary_key=("at",), strategy=strategy)  # type: ignore[arg-type]
    frame = _times([0, 1, 3, 4, 5]).with_columns(pl.col("id") * 10)
    for n in range(2):
        h.write_and_check(spec, frame, run_id=f"r{n}")
    h.write_and_check(spec, frame.with_columns(pl.col("id") + 1), run_id="changed")


def test_nanoseconds_of_a_time_are_truncated_to_microseconds_alike_on_both_arms(
    h: IcebergArm | PgArm,
) -> None:
    """polars `Time` has nanoseconds, Iceberg `time` and Postgres `time` microseconds: both arms
    keep the microseconds (the nanoseconds truncated, toward midnight), and a re-run of the same
    nanosecond frame changes nothing."""
    spec = DatasetSpec(name="nanos", primary_key=("id",), strategy="snapshot_replace")
    nanos = [1_999, 3_600 * 10**9 + 123_456_789, 86_399_999_999_999, None]
    frame = pl.DataFrame({"id": [1, 2, 3, 4], "at": pl.Series(nanos, dtype=pl.Int64).cast(pl.Time)})
    stored = frame.with_columns(
        at=pl.Series([1_000, 3_600 * 10**9 + 123_456_000, 86_399_999_999_000, None]).cast(pl.Time)
    )
    first = h.write(spec, frame)
    assert first.snapshot_id is not None
    assert_same_multiset(h.rows(spec), stored)
    again = h.write(spec, frame)
    assert again.snapshot_id is None and again.rows_updated == 0
    assert_same_multiset(h.rows(spec), stored)
