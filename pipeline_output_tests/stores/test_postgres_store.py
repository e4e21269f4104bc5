"""The legacy Postgres arm against the independent polars oracle: every strategy x first/re-deploy
(x window), each write run twice; typed round trip; begin_write + rollback; bad input; hostile names.

Contents are read back through a NEW store and ledger (nothing cached) and cross-checked with the raw
`jsonb` documents fetched by plain SQL; counters and the deploy records are checked per write.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal

from pipeline_output import DatasetSpec, Delta, Window, WriteResult
from pipeline_output.errors import (
    DuplicateKeys,
    EmptyComputeRefused,
    InvalidSpec,
    NullKey,
    RowsOutsideWindow,
    SchemaMismatch,
)
from pipeline_output.ledger import Ledger
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.iceberg_harness import (
    WINDOW,
    as_kind,
    base,
    customers,
    expect_write,
    nan_and_null_rows,
    redeploy_rows,
    spec_for,
    window_rows,
)
from pipeline_output_tests.oracle import (
    IDEMPOTENT,
    KEYED_NOOP,
    STRATEGIES,
    Expected,
    assert_counters,
    assert_same_multiset,
    is_identical_replace,
)


@dataclass
class PgHarness:
    """One test's legacy arm: a writing store and fresh read-back handles."""

    url: str

    def store(self) -> PostgresStore:
        return PostgresStore(self.url)

    def ledger(self) -> Ledger:
        return Ledger(self.url)

    def deploy_ids(self, spec: DatasetSpec) -> list[int]:
        return [d.id for d in self.ledger().deploys(spec.name, arm="pg")]

    def raw_docs(self, spec: DatasetSpec | str) -> list[dict[str, Any]]:
        """The stored documents by plain SQL (no pipeline_output code), in row_index order."""
        name = spec if isinstance(spec, str) else spec.name
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT data::text FROM pipeline_output.dataset_rows WHERE dataset_id = %s "
                "ORDER BY row_index",
                (name,),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def contents(self, spec: DatasetSpec) -> pl.DataFrame | None:
        """Committed contents via a fresh store; None when the arm has no succeeded deploy."""
        fresh = self.store()
        if not fresh.target_state(spec).has_snapshot:
            return None
        got = fresh.read(spec)
        docs = self.raw_docs(spec)
        assert got.height == len(docs)
        if spec.primary_key and got.height:
            key = spec.primary_key[0]
            assert sorted(got[key].to_list()) == sorted(d[key] for d in docs)
        return got

    def write_and_check(
        self,
        spec: DatasetSpec,
        data: pl.DataFrame,
        *,
        window: Window | None = None,
        run_id: str = "r1",
        kind: str = "polars",
    ) -> tuple[WriteResult, Expected]:
        before = self.contents(spec)
        before_ids = self.deploy_ids(spec)
        exp = expect_write(spec, before, data, window)
        res = self.store().write(spec, as_kind(data, kind), window=window, run_id=run_id)
        assert res.arm == "pg"
        assert res.write_mode == exp.write_mode, (res.write_mode, exp.write_mode)
        assert res.first_deploy is exp.first_deploy
        after = self.contents(spec)
        assert after is not None
        assert_same_multiset(after, exp.table)

        identical_replace = is_identical_replace(exp, before)
        new_ids = [i for i in self.deploy_ids(spec) if i not in before_ids]
        if exp.changes or exp.first_deploy or (identical_replace and res.snapshot_id is not None):
            assert res.snapshot_id is not None, "a write that changes the arm must be recorded"
            assert new_ids == [res.snapshot_id]
            record = self.ledger().last_deploy(spec.name, "pg")
            assert record is not None and record.id == res.snapshot_id
            assert record.status == "succeeded" and record.run_id == run_id
            assert record.write_mode == res.write_mode and record.strategy == spec.strategy
            assert record.rows_total_after == res.rows_total_after
            assert record.window == (str(window) if window is not None else None)
        else:
            assert res.snapshot_id is None, "a no-op write must not record a deploy"
            assert new_ids == []

        assert_counters(res, exp, identical_replace=identical_replace)
        assert res.rows_total_after == exp.table.height
        return res, exp


@pytest.fixture
def h(pg_db_url: str) -> PgHarness:
    return PgHarness(pg_db_url)


# --- the decision table: first deploy / re-deploy / window, each run twice -----------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_first_deploy_replaces_and_identical_rerun_is_safe(h, strategy):
    spec = spec_for(strategy)
    res, _ = h.write_and_check(spec, base(), run_id="first")
    assert (res.write_mode, res.first_deploy, res.rows_inserted) == ("replace", True, 40)
    res2, _ = h.write_and_check(spec, base(), run_id="again")
    assert res2.first_deploy is False
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None
        assert res2.rows_inserted == res2.rows_updated == res2.rows_deleted == 0
    if strategy == "append_always":
        assert len(h.raw_docs(spec)) == 80


@pytest.mark.parametrize("kind", ["polars", "lazy", "arrow"])
def test_accepts_dataframe_lazyframe_and_arrow(h, kind):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base(), kind=kind)
    h.write_and_check(spec, redeploy_rows(), kind=kind, run_id="r2")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_redeploy_matches_oracle_and_rerun_is_idempotent(h, strategy):
    spec = spec_for(strategy)
    h.write_and_check(spec, base(), run_id="r0")
    data = redeploy_rows()
    res1, exp1 = h.write_and_check(spec, data, run_id="r1")
    assert res1.first_deploy is False
    res2, _ = h.write_and_check(spec, data, run_id="r2")
    if strategy in IDEMPOTENT:
        assert_same_multiset(h.store().read(spec), exp1.table)
    else:
        assert len(h.raw_docs(spec)) == 40 + 2 * data.height
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_windowed_redeploy_matches_oracle_and_rerun(h, strategy):
    spec = spec_for(strategy, delta=True)
    h.write_and_check(spec, base(), run_id="r0")
    data = window_rows()
    _, exp1 = h.write_and_check(spec, data, window=WINDOW, run_id="w1")
    res2, _ = h.write_and_check(spec, data, window=WINDOW, run_id="w2")
    if strategy in IDEMPOTENT:
        assert_same_multiset(h.store().read(spec), exp1.table)
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_windowed_first_deploy_is_a_replace(h, strategy):
    spec = spec_for(strategy, delta=True)
    res, _ = h.write_and_check(spec, window_rows(), window=WINDOW, run_id="w1")
    assert (res.write_mode, res.first_deploy) == ("replace", True)


def test_upsert_counts_updated_unchanged_inserted_preserved(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, redeploy_rows(), run_id="r2")
    assert (res.rows_updated, res.rows_unchanged, res.rows_inserted, res.rows_preserved) == (
        10,
        10,
        20,
        20,
    )
    assert (res.rows_deleted, res.rows_total_after) == (0, 60)


def test_upsert_keeps_row_order_and_appends_new_rows(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    h.write_and_check(spec, redeploy_rows(), run_id="r2")
    assert h.store().read(spec)["id"].to_list() == list(range(1, 61))


def test_append_new_leaves_matched_rows_untouched(h):
    spec = spec_for("append_new")
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, redeploy_rows(), run_id="r2")
    assert (res.rows_inserted, res.rows_skipped, res.rows_updated) == (20, 20, 0)
    got = h.store().read(spec)
    assert got.filter(pl.col("id") == 25)["name"].to_list() == ["c25-v0"]


def test_sync_deletes_target_rows_absent_from_compute(h):
    spec = spec_for("sync")
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, redeploy_rows(), run_id="r2")
    assert (res.rows_deleted, res.rows_preserved) == (20, 0)
    assert sorted(h.store().read(spec)["id"].to_list()) == list(range(21, 61))


def test_empty_upsert_and_append_are_noops(h):
    for strategy in ("snapshot_replace", "append_always"):
        spec = spec_for(strategy, name=f"e_{strategy}")
        h.write_and_check(spec, base())
        res, _ = h.write_and_check(spec, customers([]), run_id="r2")
        assert res.snapshot_id is None


def test_first_deploy_of_empty_compute_is_recorded(h):
    spec = spec_for("snapshot_replace")
    res = h.store().write(spec, customers([]), run_id="r1")
    assert (res.rows_in, res.rows_total_after) == (0, 0)
    assert res.snapshot_id is not None
    assert h.store().read(spec).height == 0
    assert h.store().target_state(spec).has_snapshot


def test_no_primary_key_replace_and_append(h):
    spec = DatasetSpec(name="events", strategy="replace")
    data = pl.concat([customers(range(5)), customers(range(5))])  # duplicates: no key
    h.write_and_check(spec, data)
    h.write_and_check(spec, customers(range(3, 9)), run_id="r2")
    spec_a = DatasetSpec(name="log", strategy="append_always")
    h.write_and_check(spec_a, data)
    h.write_and_check(spec_a, data, run_id="r2")
    assert len(h.raw_docs(spec_a)) == 20


def test_append_always_with_a_key_accepts_repeated_keys_like_the_native_arm(h):
    spec = DatasetSpec(name="log", primary_key="id", strategy="append_always")
    h.write_and_check(spec, base())
    h.write_and_check(spec, base(), run_id="r2")
    assert h.store().count(spec) == 80


def test_composite_key_sync_and_append_new(h):
    def rows(ids: range, version: int = 0) -> pl.DataFrame:
        return customers(ids, version=version).with_columns(region=pl.col("id") % 3)

    spec = DatasetSpec(name="cmp", primary_key=("region", "id"), strategy="sync")
    h.write_and_check(spec, rows(range(30)))
    h.write_and_check(spec, rows(range(10, 40), version=1), run_id="r2")
    h.write_and_check(spec, rows(range(10, 40), version=1), run_id="r3")
    spec_n = DatasetSpec(name="cmpn", primary_key=("region", "id"), strategy="append_new")
    h.write_and_check(spec_n, rows(range(30)))
    h.write_and_check(spec_n, rows(range(20, 50), version=2), run_id="r2")


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


# --- windows: boundaries ---------------------------------------------------------------------------


def test_windowed_replace_boundaries_low_outside_high_inside(h):
    spec = DatasetSpec(
        name="events", strategy="replace", delta=Delta(source="raw", watermark="seq")
    )
    h.write_and_check(spec, base(), run_id="r0")
    res, _ = h.write_and_check(
        spec, customers([500, 501], seq=[11, 20], version=9), window=WINDOW, run_id="w"
    )
    ids = set(h.store().read(spec)["id"].to_list())
    assert 10 in ids, "seq == low is outside the window and must be kept"
    assert 20 not in ids, "seq == high is inside the window and must be replaced"
    assert 21 in ids and not ({11, 12, 19} & ids)
    assert res.rows_deleted == 10


def test_windowed_sync_boundaries_low_outside_high_inside(h):
    spec = spec_for("sync", delta=True)
    h.write_and_check(spec, base(), run_id="r0")
    res, _ = h.write_and_check(spec, customers([15]), window=WINDOW, run_id="w")
    ids = set(h.store().read(spec)["id"].to_list())
    assert ids == set(range(1, 11)) | {15} | set(range(21, 41))
    assert (res.rows_deleted, res.rows_preserved) == (9, 30)


def test_windowed_sync_with_open_low_bound(h):
    spec = spec_for("sync", delta=True)
    h.write_and_check(spec, base(), run_id="r0")
    h.write_and_check(spec, customers([3, 7]), window=Window(low=None, high=8), run_id="w")
    assert set(h.store().read(spec)["id"].to_list()) == {3, 7} | set(range(9, 41))


def test_windowed_replace_over_a_timestamp_watermark(h):
    def rows(days: list[int], version: int = 0) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "id": pl.Series(days, dtype=pl.Int64),
                "at": [datetime(2024, 1, d, 12, tzinfo=UTC) for d in days],
                "v": [f"{d}-{version}" for d in days],
            }
        )

    spec = DatasetSpec(name="ts", strategy="replace", delta=Delta(source="raw", watermark="at"))
    h.write_and_check(spec, rows(list(range(1, 11))))
    window = Window(
        low=datetime(2024, 1, 3, 12, tzinfo=UTC), high=datetime(2024, 1, 6, 12, tzinfo=UTC)
    )
    res, _ = h.write_and_check(spec, rows([4, 6], version=1), window=window, run_id="w")
    assert res.rows_deleted == 3  # days 4, 5, 6; day 3 (== low) stays


def test_read_with_window_and_columns(h):
    spec = spec_for("snapshot_replace", delta=True)
    h.write_and_check(spec, base())
    store = h.store()
    assert sorted(store.read(spec, window=WINDOW)["seq"].to_list()) == list(range(11, 21))
    only = store.read(spec, columns=["id", "name"])
    assert only.columns == ["id", "name"] and only.height == 40


# --- freshness oracle: the ledger, never a row count -----------------------------------------------


def test_drained_arm_redeploys_as_a_redeploy(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    assert h.store().drain(spec) == 40
    assert h.store().count(spec) == 0
    res, _ = h.write_and_check(spec, customers(range(1, 5)), run_id="r2")
    assert (res.first_deploy, res.write_mode) == (False, "upsert")


def test_rows_without_a_deploy_record_are_a_first_deploy(h):
    spec = spec_for("snapshot_replace")
    h.store().write(spec, base())
    with psycopg.connect(h.url) as conn:  # forget the deploy, keep the rows
        conn.execute("DELETE FROM pipeline_output.deploys")
    res = h.store().write(spec, customers(range(1, 5)))
    assert (res.first_deploy, res.write_mode, res.rows_total_after) == (True, "replace", 4)


# --- NaN and nulls are not changes; schema evolution ----------------------------------------------


def test_upsert_rerun_with_nan_and_nulls_is_a_noop(h):
    spec = spec_for("snapshot_replace")
    data = nan_and_null_rows()
    h.write_and_check(spec, data)
    res, _ = h.write_and_check(spec, data, run_id="r2")
    assert (res.rows_updated, res.rows_unchanged, res.snapshot_id) == (0, 40, None)


def test_nan_to_number_and_null_to_value_count_as_updates(h):
    spec = spec_for("snapshot_replace")
    data = customers(range(1, 5)).with_columns(
        amount=pl.lit(float("nan")), name=pl.lit(None, dtype=pl.String)
    )
    h.write_and_check(spec, data)
    res, _ = h.write_and_check(spec, customers(range(1, 5)), run_id="r2")
    assert res.rows_updated == 4


def test_added_column_and_dropped_column(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    h.write_and_check(spec, customers(range(35, 45)).with_columns(extra=pl.lit("x")), run_id="r2")
    res, _ = h.write_and_check(spec, customers(range(1, 3)).drop("name"), run_id="r3")
    assert res.rows_updated == 2  # name becomes null
    # rows written before `extra` existed are unchanged when the compute says extra=null
    res, _ = h.write_and_check(spec, customers(range(5, 8)), run_id="r4")
    assert (res.rows_unchanged, res.snapshot_id) == (3, None)


def test_narrower_integer_is_accepted_and_type_change_refused(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    narrow = customers(range(1, 5), version=3).with_columns(pl.col("seq").cast(pl.Int32))
    res = h.store().write(spec, narrow, run_id="r2")
    assert (res.rows_updated, res.rows_total_after) == (4, 40)
    assert h.store().read(spec).schema["seq"] == pl.Int64
    before = h.store().read(spec)
    with pytest.raises(SchemaMismatch, match="amount"):
        h.store().write(spec, customers(range(1, 5)).with_columns(amount=pl.lit("x")))
    assert_frame_equal(h.store().read(spec), before)


# --- typed round trip ------------------------------------------------------------------------------


def typed_frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series([1, 2, 3, 4, 5], dtype=pl.Int64),
            "i32": pl.Series([1, None, -(2**31), 2**31 - 1, 0], dtype=pl.Int32),
            "i64": pl.Series([2**63 - 1, -(2**63), None, 0, 42], dtype=pl.Int64),
            "f64": [math.nan, math.inf, -math.inf, None, 0.30000000000000004],
            "f32": pl.Series([0.1, math.nan, None, 3.4e38, -1.5], dtype=pl.Float32),
            "tiny": [1e-300, 5e-324, 1.7976931348623157e308, -0.5, 1 / 3],
            "ts": [
                datetime(2024, 1, 1, 1, 2, 3, 456789),
                None,
                datetime(1, 1, 1),
                None,
                datetime(9999, 12, 31, 23, 59, 59, 999999),
            ],
            "tsz": pl.Series(
                [
                    datetime(2024, 6, 1, 12, 0, 0, 1, tzinfo=UTC),
                    None,
                    datetime(1970, 1, 1, tzinfo=UTC),
                    datetime(2000, 2, 29, tzinfo=UTC),
                    None,
                ]
            ),
            "day": [date(2024, 2, 29), None, date(1, 1, 1), date(9999, 12, 31), date(1970, 1, 1)],
            "dec": pl.Series(
                [
                    Decimal("1.50"),
                    None,
                    Decimal("-12345678901234567.89"),
                    Decimal("0.00"),
                    Decimal("99999999999999999999.99"),
                ],
                dtype=pl.Decimal(22, 2),
            ),
            "flag": [True, False, None, True, False],
            "text": [
                "plain",
                "",
                None,
                "quote \" and ' and \\ and ; drop table x; --",
                "ünïcödé\n\ttab,comma",
            ],
            "blob": [b"\x00\x01", b"", None, b"\xff" * 3, b"x"],
            "nothing": pl.Series([None] * 5, dtype=pl.String),
        }
    )


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
    assert h.ledger().last_deploy(spec.name, "pg").id == result.snapshot_id
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
        h.ledger().flip(HOSTILE, "dual", who="t")
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


# --- the two arms agree: same counters, same typed contents ----------------------------------------

_COUNTERS = [
    "write_mode",
    "first_deploy",
    "rows_in",
    "rows_inserted",
    "rows_updated",
    "rows_deleted",
    "rows_unchanged",
    "rows_preserved",
    "rows_skipped",
    "rows_total_after",
]


@pytest.mark.parametrize("windowed", [False, True])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_both_arms_report_the_same_counters_and_contents(h, catalog, strategy, windowed):
    from pipeline_output import IcebergStore
    from pipeline_output.locks import AdvisoryLock

    native = IcebergStore(catalog, "datasets", lock=AdvisoryLock(h.url))
    legacy = h.store()
    spec = spec_for(strategy, delta=windowed)
    steps: list[tuple[pl.DataFrame, Window | None]] = [(base(), None)]
    if windowed:
        steps += [(window_rows(), WINDOW), (window_rows(), WINDOW)]
    else:
        steps += [(redeploy_rows(), None), (redeploy_rows(), None)]
    for data, window in steps:
        a = native.write(spec, data, window=window)
        b = legacy.write(spec, data, window=window)
        assert {k: getattr(b, k) for k in _COUNTERS} == {k: getattr(a, k) for k in _COUNTERS}
        assert (a.snapshot_id is None) == (b.snapshot_id is None)
        got_native, got_legacy = native.read(spec), legacy.read(spec)
        assert got_legacy.schema == got_native.schema
        assert_same_multiset(got_legacy, got_native)


def test_both_arms_read_the_typed_frame_identically(h, catalog):
    from pipeline_output import IcebergStore
    from pipeline_output.locks import AdvisoryLock

    native = IcebergStore(catalog, "datasets", lock=AdvisoryLock(h.url))
    spec = DatasetSpec(name="typed", primary_key="id")
    native.write(spec, typed_frame())
    h.store().write(spec, typed_frame())
    got_native, got_legacy = native.read(spec), h.store().read(spec)
    assert got_legacy.schema == got_native.schema
    assert_frame_equal(got_legacy, got_native.sort("id"), check_exact=True)
