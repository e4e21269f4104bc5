"""The legacy Postgres arm's own behaviour: row order, re-keying, the freshness oracle's ledger,
the typed round trip, begin_write + rollback, bad input, hostile names and values.

The scenarios both arms share (every strategy x first/re-deploy (x window), each write run twice,
windows, NaN/null no-ops, schema evolution) run on both in `test_arm_conformance.py`. Writes here
are checked by `arms.PgHarness`: contents read back through a NEW store and ledger (nothing cached),
cross-checked with the raw `jsonb` documents fetched by plain SQL; counters and the deploy records
against the independent polars oracle.
"""

from __future__ import annotations

import threading
from datetime import datetime

import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal

from pipeline_output import DatasetSpec, Delta, WriteResult
from pipeline_output.errors import (
    DuplicateKeys,
    EmptyComputeRefused,
    InvalidSpec,
    NullKey,
    RowsOutsideWindow,
)
from pipeline_output_tests.iceberg_harness import WINDOW, base, customers, redeploy_rows, spec_for
from pipeline_output_tests.oracle import STRATEGIES
from pipeline_output_tests.stores.arms import PgHarness, typed_frame


@pytest.fixture
def h(pg_db_url: str) -> PgHarness:
    return PgHarness(pg_db_url)


# --- row order, re-keying, a larger upsert ---------------------------------------------------------


def test_upsert_keeps_row_order_and_appends_new_rows(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    h.write_and_check(spec, redeploy_rows(), run_id="r2")
    assert h.store().read(spec)["id"].to_list() == list(range(1, 61))


def test_a_changed_primary_key_rekeys_the_stored_rows(h):
    data = customers(range(10)).with_columns(code=pl.format("k{}", pl.col("id")))
    h.write_and_check(DatasetSpec(name="rekey", primary_key="id", strategy="sync"), data)
    by_code = DatasetSpec(name="rekey", primary_key="code", strategy="sync")
    changed = data.head(5).with_columns(id=pl.col("id") + 100)
    res, _ = h.write_and_check(by_code, changed, run_id="r2")
    assert (res.rows_updated, res.rows_deleted, res.rows_inserted) == (5, 5, 0)


def test_larger_upsert_matches_oracle(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, customers(range(20_000)))
    h.write_and_check(spec, customers(range(15_000, 30_000), version=1), run_id="r2")


# --- freshness oracle: the ledger, never a row count -----------------------------------------------


def test_rows_without_a_deploy_record_are_a_first_deploy(h):
    spec = spec_for("snapshot_replace")
    h.store().write(spec, base())
    with psycopg.connect(h.url) as conn:  # forget the deploy, keep the rows
        conn.execute("DELETE FROM pipeline_output.deploys")
    res = h.store().write(spec, customers(range(1, 5)))
    assert (res.first_deploy, res.write_mode, res.rows_total_after) == (True, "replace", 4)


# --- typed round trip ------------------------------------------------------------------------------


def test_typed_round_trip_restores_every_type_exactly(h):
    spec = DatasetSpec(name="typed", primary_key="id")
    data = typed_frame()
    h.store().write(spec, data)
    got = h.store().read(spec)
    assert got.schema == data.schema
    assert_frame_equal(got, data, check_exact=True)
    # and NaN/nulls do not make the re-deploy rewrite anything
    res = h.store().write(spec, data)
    assert (res.rows_unchanged, res.rows_updated, res.snapshot_id) == (5, 0, None)


def test_small_ints_and_ms_timestamps_take_the_native_arms_types(h):
    spec = DatasetSpec(name="kinds", strategy="replace")
    data = pl.DataFrame(
        {
            "i8": pl.Series([1, -2], dtype=pl.Int8),
            "u64": pl.Series([1, 2], dtype=pl.UInt64),
            "ms": pl.Series([datetime(2024, 1, 1, 1), None]).cast(pl.Datetime("ms")),
        }
    )
    h.store().write(spec, data)
    got = h.store().read(spec)
    assert dict(got.schema) == {"i8": pl.Int32, "u64": pl.Int64, "ms": pl.Datetime("us")}
    assert got["i8"].to_list() == [1, -2] and got["ms"].to_list() == [datetime(2024, 1, 1, 1), None]


def test_keys_of_every_kind_match_on_redeploy(h):
    data = (
        typed_frame()
        .select("text", "day", "dec", "tsz", "flag")
        .drop_nulls(["text", "day", "dec", "tsz"])
    )
    spec = DatasetSpec(name="keys", primary_key=("text", "day", "dec", "tsz"))
    h.store().write(spec, data)
    res = h.store().write(spec, data.with_columns(flag=pl.lit(True)))
    assert (res.rows_inserted, res.rows_updated + res.rows_unchanged) == (0, data.height)


# --- begin_write / rollback ------------------------------------------------------------------------


def test_begin_write_then_rollback_leaves_the_arm_and_ledger_unchanged(h):
    spec = spec_for("snapshot_replace")
    h.store().write(spec, base())
    before, before_ids = h.store().read(spec), h.deploy_ids(spec)
    pending = h.store().begin_write(spec, redeploy_rows(), run_id="dual")
    assert pending.result.rows_inserted == 20 and pending.result.snapshot_id is not None
    assert_frame_equal(h.store().read(spec), before)  # invisible before commit
    pending.rollback()
    assert_frame_equal(h.store().read(spec), before)
    assert h.deploy_ids(spec) == before_ids


def test_begin_write_then_commit_and_context_manager_rolls_back_on_error(h):
    spec = spec_for("snapshot_replace")
    pending = h.store().begin_write(spec, base(), run_id="c")
    result = pending.commit()
    assert h.ledger().deploy_log.last_deploy(spec.name, "pg").id == result.snapshot_id
    with pytest.raises(RuntimeError, match="boom"), h.store().begin_write(spec, redeploy_rows()):
        raise RuntimeError("boom")
    assert h.store().count(spec) == 40


def test_an_open_write_blocks_a_second_writer_of_the_same_dataset(h):
    spec = spec_for("append_always")
    h.store().write(spec, base())
    pending = h.store().begin_write(spec, customers(range(100, 110)))
    done = threading.Event()
    results: list[WriteResult] = []

    def second() -> None:
        results.append(h.store().write(spec, customers(range(200, 205))))
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not done.wait(1.0), "the second writer must wait for the first transaction"
    pending.commit()
    thread.join(30)
    assert results and results[0].rows_preserved == 50
    assert h.store().count(spec) == 55


# --- bad input writes nothing ----------------------------------------------------------------------


def _unchanged(h: PgHarness, spec: DatasetSpec, action) -> None:
    before, ids = h.store().read(spec), h.deploy_ids(spec)
    action()
    assert_frame_equal(h.store().read(spec), before)
    assert h.deploy_ids(spec) == ids


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_duplicate_and_null_keys_are_refused_and_write_nothing(h, strategy):
    spec = spec_for(strategy)
    h.store().write(spec, base())

    def dupes() -> None:
        with pytest.raises(DuplicateKeys, match="7"):
            h.store().write(spec, pl.concat([customers([7]), customers([7, 8], version=1)]))

    def nulls() -> None:
        with pytest.raises(NullKey):
            h.store().write(spec, customers([1, 2]).with_columns(id=pl.lit(None, dtype=pl.Int64)))

    _unchanged(h, spec, dupes)
    _unchanged(h, spec, nulls)


@pytest.mark.parametrize("strategy", ["replace", "sync"])
def test_empty_compute_on_non_empty_target_is_refused(h, strategy):
    spec = spec_for(strategy)
    h.store().write(spec, base())

    def empty() -> None:
        with pytest.raises(EmptyComputeRefused):
            h.store().write(spec, customers([]))

    _unchanged(h, spec, empty)
    allowed = DatasetSpec(
        name=spec.name, primary_key="id", strategy=spec.strategy, allow_empty=True
    )
    res = h.store().write(allowed, customers([]))
    assert (res.rows_deleted, res.rows_total_after) == (40, 0)


def test_windowed_replace_refuses_rows_outside_the_window(h):
    spec = DatasetSpec(
        name="events", strategy="replace", delta=Delta(source="raw", watermark="seq")
    )
    h.store().write(spec, base())

    def outside() -> None:
        with pytest.raises(RowsOutsideWindow):
            h.store().write(spec, customers([1, 15]), window=WINDOW)

    _unchanged(h, spec, outside)


# --- hostile names and values ----------------------------------------------------------------------

HOSTILE = 'x"; drop table dataset_rows; --'


def test_hostile_dataset_and_column_names_are_rejected_by_the_spec(h):
    with pytest.raises(InvalidSpec):
        DatasetSpec(name=HOSTILE)
    with pytest.raises(InvalidSpec):
        DatasetSpec(name="ok", primary_key=(HOSTILE,))
    spec = DatasetSpec(name="ok", strategy="replace")
    with pytest.raises(InvalidSpec):
        h.store().write(spec, pl.DataFrame({HOSTILE: [1]}))
    with pytest.raises(InvalidSpec):
        h.ledger().flip_log.flip(HOSTILE, "dual", who="t")
    h.store().write(spec, pl.DataFrame({"a": [1]}))
    with pytest.raises(InvalidSpec):
        h.store().read(spec, columns=[HOSTILE])
    assert h.store().read(spec)["a"].to_list() == [1]


def test_hostile_values_round_trip_and_execute_nothing(h):
    spec = DatasetSpec(name="ok", primary_key="k")
    data = pl.DataFrame(
        {"k": [HOSTILE, "'; DELETE FROM pipeline_output.deploys; --"], "v": [HOSTILE, "$1 %s {}"]}
    )
    h.store().write(spec, data)
    h.store().write(spec, data.with_columns(v=pl.lit("changed")))
    got = h.store().read(spec)
    assert got["k"].to_list() == data["k"].to_list()
    assert got["v"].to_list() == ["changed", "changed"]
    assert len(h.deploy_ids(spec)) == 2
    assert h.store().count(HOSTILE) == 0  # a hostile name used as a value is just a value
