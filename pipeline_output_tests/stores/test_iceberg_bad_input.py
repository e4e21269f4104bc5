"""Bad input to the Iceberg arm: a clear error naming the dataset, nothing written, table unchanged."""

from __future__ import annotations

from contextlib import contextmanager

import polars as pl
import pytest

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.errors import (
    BadInput,
    DuplicateKeys,
    EmptyComputeRefused,
    MissingKeyColumn,
    NullKey,
    PipelineOutputError,
    RowsOutsideWindow,
    SchemaMismatch,
)
from pipeline_output_tests.iceberg_harness import Harness, customers
from pipeline_output_tests.oracle import assert_same_multiset


@pytest.fixture
def h(catalog, fresh_catalog, pg_db_url) -> Harness:
    return Harness(catalog, fresh_catalog, pg_db_url)


def spec_for(strategy: str = "snapshot_replace", **kw) -> DatasetSpec:
    return DatasetSpec(name="customers", primary_key=("id",), strategy=strategy, **kw)


@contextmanager
def unchanged(h: Harness, spec: DatasetSpec):
    """The table (or its absence) is exactly the same after the block."""
    existed = h.exists(spec)
    ids = h.snapshot_ids(spec)
    rows = h.raw(spec) if existed and ids else None
    yield
    assert h.exists(spec) == existed, "a refused write must not create the table"
    assert h.snapshot_ids(spec) == ids, "a refused write must not commit a snapshot"
    if rows is not None:
        assert_same_multiset(h.raw(spec), rows)


def seeded(h: Harness, spec: DatasetSpec) -> None:
    h.store().write(spec, customers(range(1, 41)), run_id="seed")


def with_dupes() -> pl.DataFrame:
    return pl.concat([customers(range(1, 11)), customers([5, 7, 7], version=1)])


# --- duplicate keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["snapshot_replace", "append_new", "sync"])
def test_duplicate_keys_on_redeploy_are_refused_listing_offending_keys(h, strategy):
    spec = spec_for(strategy)
    seeded(h, spec)
    with unchanged(h, spec), pytest.raises(DuplicateKeys) as err:
        h.store().write(spec, with_dupes(), run_id="bad")
    msg = str(err.value)
    assert "customers" in msg
    assert "5" in msg and "7" in msg


def test_duplicate_keys_on_first_deploy_create_no_table(h):
    spec = spec_for()
    with unchanged(h, spec), pytest.raises(DuplicateKeys) as err:
        h.store().write(spec, with_dupes(), run_id="bad")
    assert "customers" in str(err.value)


def test_duplicate_composite_keys_are_listed(h):
    spec = DatasetSpec(name="comp", primary_key=("a", "b"))
    data = pl.DataFrame({"a": [1, 1, 2, 2], "b": ["x", "x", "y", "z"], "v": [1, 2, 3, 4]})
    with unchanged(h, spec), pytest.raises(DuplicateKeys) as err:
        h.store().write(spec, data)
    msg = str(err.value)
    assert "comp" in msg and "x" in msg and "1" in msg


def test_dedupe_by_keeps_the_last_row_per_key_by_that_column(h):
    spec = spec_for(dedupe_by="version")
    data = pl.DataFrame(
        {
            "id": [1, 1, 1, 2, 2, 3],
            "version": [2, 3, 1, 9, 4, 1],
            "name": ["b", "c", "a", "late", "early", "only"],
        }
    )
    res = h.store().write(spec, data, run_id="r1")
    assert res.rows_total_after == 3
    got = dict(h.raw(spec).select("id", "name").rows())
    assert got == {1: "c", 2: "late", 3: "only"}
    # and on a re-deploy the de-duplicated rows upsert normally
    data2 = pl.DataFrame({"id": [1, 1], "version": [5, 6], "name": ["x", "y"]})
    res2 = h.store().write(spec, data2, run_id="r2")
    assert res2.rows_updated == 1
    assert dict(h.raw(spec).select("id", "name").rows())[1] == "y"


# --- key columns ---------------------------------------------------------------------------------


@pytest.mark.parametrize("first", [True, False], ids=["first-deploy", "re-deploy"])
def test_null_key_is_refused(h, first):
    spec = spec_for()
    if not first:
        seeded(h, spec)
    data = customers(range(50, 55)).with_columns(
        id=pl.when(pl.col("id") == 52).then(None).otherwise(pl.col("id"))
    )
    with unchanged(h, spec), pytest.raises(NullKey) as err:
        h.store().write(spec, data)
    assert "customers" in str(err.value) and "id" in str(err.value)


def test_null_in_one_composite_key_column_is_refused(h):
    spec = DatasetSpec(name="comp", primary_key=("a", "b"))
    data = pl.DataFrame({"a": [1, 2], "b": ["x", None], "v": [1, 2]})
    with unchanged(h, spec), pytest.raises(NullKey) as err:
        h.store().write(spec, data)
    assert "comp" in str(err.value)


@pytest.mark.parametrize("first", [True, False], ids=["first-deploy", "re-deploy"])
def test_missing_key_column_is_refused_naming_it(h, first):
    spec = spec_for()
    if not first:
        seeded(h, spec)
    with unchanged(h, spec), pytest.raises(MissingKeyColumn) as err:
        h.store().write(spec, customers(range(3)).rename({"id": "ident"}))
    msg = str(err.value)
    assert "customers" in msg
    assert "'id'" in msg or '"id"' in msg


def test_key_column_type_change_is_refused(h):
    spec = spec_for()
    seeded(h, spec)
    data = customers(range(1, 5)).with_columns(pl.col("id").cast(pl.String))
    with unchanged(h, spec), pytest.raises(BadInput) as err:
        h.store().write(spec, data)
    assert "customers" in str(err.value) and "id" in str(err.value)


# --- incompatible type changes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "new_value", "old_names", "new_names"),
    [
        (
            "amount",
            pl.col("amount").cast(pl.String),
            ("double", "float64", "f64"),
            ("string", "str"),
        ),
        ("name", pl.lit(7, dtype=pl.Int64), ("string", "str", "utf8"), ("long", "int64", "i64")),
        ("day", pl.col("day").cast(pl.String), ("date",), ("string", "str", "utf8")),
    ],
    ids=["double->string", "string->long", "date->string"],
)
def test_incompatible_type_change_raises_schema_mismatch_naming_column_and_types(
    h, column, new_value, old_names, new_names
):
    spec = spec_for()
    seeded(h, spec)
    data = customers(range(1, 5)).with_columns(new_value.alias(column))
    with unchanged(h, spec), pytest.raises(SchemaMismatch) as err:
        h.store().write(spec, data)
    msg = str(err.value).lower()
    assert "customers" in msg
    assert column in msg
    assert any(n in msg for n in old_names), msg
    assert any(n in msg for n in new_names), msg


@pytest.mark.parametrize("strategy", ["append_always", "append_new", "replace", "sync"])
def test_type_change_is_refused_for_every_strategy(h, strategy):
    spec = spec_for(strategy)
    seeded(h, spec)
    data = customers(range(100, 104)).with_columns(pl.col("amount").cast(pl.String))
    with unchanged(h, spec), pytest.raises(SchemaMismatch):
        h.store().write(spec, data)


# --- empty computes ------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["replace", "sync"])
def test_empty_compute_on_non_empty_target_is_refused(h, strategy):
    spec = spec_for(strategy)
    seeded(h, spec)
    with unchanged(h, spec), pytest.raises(EmptyComputeRefused) as err:
        h.store().write(spec, customers([]), run_id="empty")
    assert "customers" in str(err.value)


@pytest.mark.parametrize("strategy", ["replace", "sync"])
def test_empty_compute_with_allow_empty_wipes_the_table_in_one_snapshot(h, strategy):
    spec = spec_for(strategy, allow_empty=True)
    seeded(h, spec)
    before = h.snapshot_ids(spec)
    res = h.store().write(spec, customers([]), run_id="empty")
    assert res.rows_total_after == 0
    assert h.raw(spec).height == 0
    assert res.snapshot_id is not None
    assert h.snapshot_ids(spec) == [*before, res.snapshot_id]


def test_empty_compute_without_key_columns_is_refused_for_replace(h):
    spec = DatasetSpec(name="events", strategy="replace")
    h.store().write(spec, customers(range(5)))
    with unchanged(h, spec), pytest.raises(EmptyComputeRefused):
        h.store().write(spec, pl.DataFrame({"id": pl.Series([], dtype=pl.Int64)}))


# --- windows -------------------------------------------------------------------------------------


def test_windowed_replace_refuses_rows_outside_the_window(h):
    spec = DatasetSpec(
        name="events", strategy="replace", delta=Delta(source="raw", watermark="seq")
    )
    h.store().write(spec, customers(range(1, 41)))
    # seq 10 equals low: outside the half-open window (10, 20]
    data = customers([900, 901], seq=[10, 15])
    with unchanged(h, spec), pytest.raises(RowsOutsideWindow) as err:
        h.store().write(spec, data, window=Window(low=10, high=20))
    assert "events" in str(err.value)


def test_windowed_replace_refuses_a_target_without_the_watermark_column(h):
    spec_plain = DatasetSpec(name="events", strategy="replace")
    h.store().write(spec_plain, customers(range(1, 10)).drop("seq"))
    spec = DatasetSpec(
        name="events", strategy="replace", delta=Delta(source="raw", watermark="seq")
    )
    with unchanged(h, spec), pytest.raises(PipelineOutputError) as err:
        h.store().write(spec, customers([3]), window=Window(low=0, high=5))
    assert "events" in str(err.value)


# --- input types ---------------------------------------------------------------------------------


def test_unsupported_input_type_is_bad_input(h):
    spec = spec_for()
    with unchanged(h, spec), pytest.raises(BadInput) as err:
        h.store().write(spec, [{"id": 1}])  # type: ignore[arg-type]
    assert "customers" in str(err.value)


def test_a_duration_column_is_refused_saying_how_to_store_it(h):
    spec = spec_for()
    frame = customers(range(3)).with_columns(wait=pl.Series([1, 2, 3], dtype=pl.Duration("us")))
    with unchanged(h, spec), pytest.raises(BadInput) as err:
        h.store().write(spec, frame)
    assert str(err.value) == (
        "dataset 'customers': column 'wait' has type Duration(time_unit='us'), which Iceberg "
        "cannot store: store it as a number, e.g. pl.col('wait').dt.total_microseconds()"
    )


def test_failing_lazyframe_is_bad_input(h):
    spec = spec_for()
    seeded(h, spec)
    lazy = customers(range(3)).lazy().with_columns(pl.col("name").str.to_integer())
    with unchanged(h, spec), pytest.raises(BadInput) as err:
        h.store().write(spec, lazy)
    assert "customers" in str(err.value)


def test_dedupe_by_column_missing_from_output_is_bad_input(h):
    spec = spec_for(dedupe_by="version")
    with unchanged(h, spec), pytest.raises(BadInput) as err:
        h.store().write(spec, customers(range(3)))
    assert "version" in str(err.value)


def test_windowed_replace_of_a_keyed_dataset_never_duplicates_a_key(h):
    """Compute row id 30 moved into the window (seq 15) while the target's id 30 lies outside it
    (seq 30). Replacing only the window's rows must not leave id 30 twice: refuse, or dedupe."""
    spec = DatasetSpec(
        name="events",
        primary_key=("id",),
        strategy="replace",
        delta=Delta(source="raw", watermark="seq"),
    )
    h.store().write(spec, customers(range(1, 41)))
    before_ids = h.snapshot_ids(spec)
    before = h.raw(spec)
    try:
        h.store().write(spec, customers([30], seq=[15]), window=Window(low=10, high=20))
    except PipelineOutputError as exc:
        assert "events" in str(exc)
        assert h.snapshot_ids(spec) == before_ids
        assert_same_multiset(h.raw(spec), before)
        return
    table = h.raw(spec)
    dupes = table.group_by("id").len().filter(pl.col("len") > 1)
    assert dupes.height == 0, f"primary key duplicated by a windowed replace: {dupes.rows()}"


def test_all_null_column_of_null_dtype_is_written_as_nulls_of_the_table_type(h):
    """`pl.lit(None)` (polars' Null dtype) carries no type: it fits any existing column."""
    spec = spec_for()
    seeded(h, spec)
    data = customers(range(50, 53)).with_columns(amount=pl.lit(None))
    res = h.store().write(spec, data, run_id="nulls")
    assert res.rows_inserted == 3
    table = h.raw(spec)
    assert table.schema["amount"] == pl.Float64
    assert table.filter(pl.col("id") >= 50)["amount"].null_count() == 3
