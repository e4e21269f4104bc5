"""Both arms against the same oracle: every scenario here runs once on the native Iceberg arm and
once on the legacy Postgres arm (`arm=iceberg`, `arm=pg`), through the harnesses in `arms.py`.

Every strategy x first/re-deploy (x window), each write run twice; the expected contents and
counters come from the independent polars oracle (`pipeline_output_tests.oracle`), the rows are read
back through fresh handles and cross-checked with the raw storage, and each write must make exactly
one commit (an Iceberg snapshot, a `pg` deploy record) or, when it changes nothing, none.

Arm-specific behaviour stays in the per-arm modules: Iceberg files, snapshots, pruning and nested
types in `test_iceberg_store.py`; Postgres transactions, re-keying, the typed round trip and hostile
values in `test_postgres_store.py`. The last section writes the same inputs to both arms side by side.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline_output import DatasetSpec, Delta, IcebergStore, Window
from pipeline_output.errors import SchemaMismatch
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.iceberg_harness import (
    WINDOW,
    base,
    customers,
    nan_and_null_rows,
    redeploy_rows,
    spec_for,
    window_rows,
)
from pipeline_output_tests.oracle import IDEMPOTENT, KEYED_NOOP, STRATEGIES, assert_same_multiset
from pipeline_output_tests.stores.arms import (
    composite,
    typed_frame,
)

# --- first deploy, run twice ---------------------------------------------------------------------


@pytest.mark.rest_default
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_first_deploy_replaces_and_identical_rerun_is_safe(h, arm, strategy):
    spec = spec_for(strategy)
    data = base()
    res, _ = h.write_and_check(spec, data, run_id="first")
    assert (res.write_mode, res.first_deploy, res.rows_inserted) == ("replace", True, 40)
    if arm == "iceberg":  # the key becomes the table's identifier fields (an Iceberg schema notion)
        assert h.iceberg.table(spec).schema().identifier_field_names() == {"id"}

    res2, _ = h.write_and_check(spec, data, run_id="again")
    assert res2.first_deploy is False
    if strategy == "append_always":
        assert res2.rows_inserted == 40
        assert h.rows(spec).height == 80
    else:
        assert_same_multiset(h.rows(spec), data)
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None
        assert res2.rows_inserted == res2.rows_updated == res2.rows_deleted == 0
    assert len(h.commits(spec)) == (1 if res2.snapshot_id is None else 2)


@pytest.mark.parametrize("kind", ["polars", "lazy", "arrow"])
def test_first_deploy_and_redeploy_accept_dataframe_lazyframe_and_arrow(h, kind):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base(), kind=kind)
    h.write_and_check(spec, redeploy_rows(), kind=kind, run_id="r2")  # the same input kind


def test_first_deploy_of_empty_compute_is_recorded(h):
    spec = spec_for("snapshot_replace")
    res = h.write(spec, customers([]), run_id="r1")
    assert (res.rows_in, res.rows_total_after) == (0, 0)
    assert res.snapshot_id is not None
    assert h.has_commit(spec)
    assert h.commits(spec) == [res.snapshot_id]
    assert h.read(spec).height == 0


# --- re-deploy, run twice ------------------------------------------------------------------------


@pytest.mark.rest_default
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_redeploy_matches_oracle_and_rerun_is_idempotent(h, strategy):
    spec = spec_for(strategy)
    h.write_and_check(spec, base(), run_id="r0")
    data = redeploy_rows()
    res1, exp1 = h.write_and_check(spec, data, run_id="r1")
    assert res1.first_deploy is False
    res2, _ = h.write_and_check(spec, data, run_id="r2")
    if strategy in IDEMPOTENT:  # the second run leaves the same rows
        assert_same_multiset(h.rows(spec), exp1.table)
    else:
        assert h.rows(spec).height == 40 + 2 * data.height
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


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


def test_sync_deletes_target_rows_absent_from_compute(h):
    spec = spec_for("sync")
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, redeploy_rows(), run_id="r2")
    assert (res.rows_deleted, res.rows_preserved) == (20, 0)
    assert sorted(h.rows(spec)["id"].to_list()) == list(range(21, 61))


def test_append_new_inserts_only_absent_keys_and_leaves_matched_rows_untouched(h):
    spec = spec_for("append_new")
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, redeploy_rows(), run_id="r2")
    assert (res.rows_inserted, res.rows_skipped, res.rows_updated) == (20, 20, 0)
    # ids 21..30 were "changed" in the compute but append_new must keep the target's version
    assert h.rows(spec).filter(pl.col("id") == 25)["name"].to_list() == ["c25-v0"]


def test_append_always_with_a_key_accepts_repeated_keys(h):
    spec = DatasetSpec(name="log", primary_key="id", strategy="append_always")
    h.write_and_check(spec, base())
    h.write_and_check(spec, base(), run_id="r2")
    assert h.rows(spec).height == 80


@pytest.mark.parametrize("strategy", ["snapshot_replace", "append_always"])
def test_empty_compute_on_a_non_empty_target_is_a_noop(h, strategy):
    spec = spec_for(strategy)
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, customers([]), run_id="r2")
    assert res.snapshot_id is None
    assert res.rows_preserved == 40
    assert len(h.commits(spec)) == 1


def test_no_primary_key_replace_and_append(h):
    spec = DatasetSpec(name="events", strategy="replace")
    data = pl.concat([customers(range(5)), customers(range(5))])  # duplicates are fine: no key
    h.write_and_check(spec, data)
    h.write_and_check(spec, customers(range(3, 9)), run_id="r2")
    spec_a = DatasetSpec(name="log", strategy="append_always")
    h.write_and_check(spec_a, data)
    h.write_and_check(spec_a, data, run_id="r2")
    assert h.rows(spec_a).height == 20


def test_composite_key_sync_and_append_new_match_oracle_and_rerun(h):
    key = ("k_int", "k_str", "k_date")
    spec = DatasetSpec(name="comp_sync", primary_key=key, strategy="sync")
    h.write_and_check(spec, composite(0, 3_000))
    h.write_and_check(spec, composite(1_000, 4_000, version=1), run_id="r2")
    rerun, _ = h.write_and_check(spec, composite(1_000, 4_000, version=1), run_id="r3")
    assert rerun.snapshot_id is None
    spec_n = DatasetSpec(name="comp_new", primary_key=key, strategy="append_new")
    h.write_and_check(spec_n, composite(0, 3_000))
    res, _ = h.write_and_check(spec_n, composite(1_000, 4_000, version=1), run_id="r2")
    assert (res.rows_inserted, res.rows_skipped) == (1_000, 2_000)
    rerun, _ = h.write_and_check(spec_n, composite(1_000, 4_000, version=1), run_id="r3")
    assert (rerun.snapshot_id, rerun.rows_skipped) == (None, 3_000)


# --- windows -------------------------------------------------------------------------------------


@pytest.mark.rest_default
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_windowed_redeploy_matches_oracle_and_rerun(h, strategy):
    spec = spec_for(strategy, delta=True)
    h.write_and_check(spec, base(), run_id="r0")
    data = window_rows()
    _, exp1 = h.write_and_check(spec, data, window=WINDOW, run_id="w1")
    res2, _ = h.write_and_check(spec, data, window=WINDOW, run_id="w2")
    if strategy in IDEMPOTENT:
        assert_same_multiset(h.rows(spec), exp1.table)
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_windowed_first_deploy_is_a_replace_and_its_rerun_a_redeploy(h, strategy):
    spec = spec_for(strategy, delta=True)
    res, _ = h.write_and_check(spec, window_rows(), window=WINDOW, run_id="w1")
    assert (res.write_mode, res.first_deploy) == ("replace", True)
    res2, _ = h.write_and_check(spec, window_rows(), window=WINDOW, run_id="w2")
    assert res2.first_deploy is False


def test_windowed_replace_boundaries_low_outside_high_inside(h):
    spec = DatasetSpec(
        name="events", strategy="replace", delta=Delta(source="raw", watermark="seq")
    )
    h.write_and_check(spec, base(), run_id="r0")
    # The window's compute has none of the old rows: every target row inside (10, 20] goes.
    res, _ = h.write_and_check(
        spec, customers([500, 501], seq=[11, 20], version=9), window=WINDOW, run_id="w"
    )
    ids = set(h.rows(spec)["id"].to_list())
    assert 10 in ids, "seq == low is outside the window and must be kept"
    assert 20 not in ids, "seq == high is inside the window and must be replaced"
    assert 21 in ids and not ({11, 12, 19} & ids)
    assert res.rows_deleted == 10


def test_windowed_sync_boundaries_low_outside_high_inside(h):
    spec = spec_for("sync", delta=True)
    h.write_and_check(spec, base(), run_id="r0")
    # compute mentions only id 15: within (10, 20] every other target row is deleted
    res, _ = h.write_and_check(spec, customers([15]), window=WINDOW, run_id="w")
    ids = set(h.rows(spec)["id"].to_list())
    assert ids == set(range(1, 11)) | {15} | set(range(21, 41))
    assert (res.rows_deleted, res.rows_preserved) == (9, 30)


def test_windowed_sync_with_open_low_bound(h):
    spec = spec_for("sync", delta=True)
    h.write_and_check(spec, base(), run_id="r0")
    h.write_and_check(spec, customers([3, 7]), window=Window(low=None, high=8), run_id="w")
    assert set(h.rows(spec)["id"].to_list()) == {3, 7} | set(range(9, 41))


def test_windowed_sync_over_a_timestamp_watermark_keeps_low_and_deletes_high(h):
    def rows(ids: list[int], version: int = 0) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "id": pl.Series(ids, dtype=pl.Int64),
                "v": pl.Series([i + version for i in ids], dtype=pl.Int64),
                "at": pl.Series(
                    [datetime(2024, 1, 1) + timedelta(hours=i) for i in ids],
                    dtype=pl.Datetime("us"),
                ),
            }
        )

    spec = DatasetSpec(
        name="ts_sync", primary_key=("id",), strategy="sync", delta=Delta("raw", "at")
    )
    h.build(spec, [rows(list(range(k * 10, k * 10 + 10))) for k in range(3)])  # 3 files on Iceberg
    w = Window(low=datetime(2024, 1, 1, 5), high=datetime(2024, 1, 1, 15))
    h.write_and_check(spec, rows([7, 12], version=1), window=w, run_id="w")
    # hour 5 is the low bound (kept), hour 15 the high bound (inside: deleted)
    assert set(h.rows(spec)["id"].to_list()) == set(range(0, 6)) | {7, 12} | set(range(16, 30))
    rerun, _ = h.write_and_check(spec, rows([7, 12], version=1), window=w, run_id="w2")
    assert rerun.snapshot_id is None


def test_windowed_replace_over_a_utc_timestamp_watermark_keeps_low_and_replaces_high(h):
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
    h.write_and_check(spec, rows([4, 6], version=1), window=window, run_id="w2")


def test_read_with_window_and_columns(h):
    spec = spec_for("snapshot_replace", delta=True)
    h.write_and_check(spec, base())
    assert sorted(h.read(spec, window=WINDOW)["seq"].to_list()) == list(range(11, 21))
    only = h.read(spec, columns=["id", "name"])
    assert only.columns == ["id", "name"]
    assert only.height == 40


# --- freshness oracle: the arm's commit history, never a row count -------------------------------


def test_drained_target_is_a_redeploy_not_a_first_deploy(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    h.drain(spec)
    assert h.rows(spec).height == 0
    assert h.has_commit(spec)
    res, _ = h.write_and_check(spec, customers(range(1, 5)), run_id="r2")
    assert (res.first_deploy, res.write_mode) == (False, "upsert")


# --- nulls and NaN do not count as changes -------------------------------------------------------


def test_upsert_rerun_with_nan_and_nulls_in_value_columns_is_a_noop(h):
    spec = spec_for("snapshot_replace")
    data = nan_and_null_rows()
    h.write_and_check(spec, data)
    res, _ = h.write_and_check(spec, data, run_id="r2")
    assert (res.rows_updated, res.rows_unchanged, res.snapshot_id) == (0, 40, None)
    assert len(h.commits(spec)) == 1


def test_nan_to_number_and_null_to_value_count_as_updates(h):
    spec = spec_for("snapshot_replace")
    data = customers(range(1, 5)).with_columns(
        amount=pl.lit(float("nan")), name=pl.lit(None, dtype=pl.String)
    )
    h.write_and_check(spec, data)
    res, _ = h.write_and_check(spec, customers(range(1, 5)), run_id="r2")
    assert res.rows_updated == 4


# --- schema evolution ----------------------------------------------------------------------------


@pytest.mark.rest_default
def test_added_column_evolves_schema_in_the_same_commit(h, arm):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    if arm == "iceberg":
        schema_before = h.iceberg.table(spec).schema().schema_id
    data = redeploy_rows().with_columns(tier=pl.format("t{}", pl.col("id") % 3))
    res, _ = h.write_and_check(spec, data, run_id="r2")
    assert len(h.commits(spec)) == 2  # schema change + data = one new commit
    if (
        arm == "iceberg"
    ):  # a new Iceberg schema id (the legacy arm registers its schema unversioned)
        assert h.iceberg.table(spec).schema().schema_id != schema_before
    rows = h.rows(spec)
    assert "tier" in rows.columns
    assert rows.filter(pl.col("id") <= 20)["tier"].null_count() == 20
    assert rows.filter(pl.col("id") > 20)["tier"].null_count() == 0
    # an added column on a matched row is an update, never "unchanged"
    assert res.rows_updated == 20
    # rows written before the column existed are unchanged when the compute leaves it out
    res, _ = h.write_and_check(spec, customers(range(5, 8)), run_id="r3")
    assert (res.rows_unchanged, res.snapshot_id) == (3, None)


def test_dropped_column_stays_in_the_table_null_in_new_and_updated_rows(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, customers(range(100, 110)).drop("day"), run_id="r2")
    assert res.rows_inserted == 10
    rows = h.rows(spec)
    assert "day" in rows.columns
    assert rows.filter(pl.col("id") >= 100)["day"].null_count() == 10
    assert rows.filter(pl.col("id") < 100)["day"].null_count() == 0
    # an updated row is replaced whole: the column the compute no longer returns becomes null
    res, _ = h.write_and_check(spec, customers(range(1, 3)).drop("name"), run_id="r3")
    assert res.rows_updated == 2
    assert h.rows(spec).filter(pl.col("id") <= 2)["name"].to_list() == [None, None]


def test_narrower_integer_is_accepted_into_a_long_column_and_a_type_change_refused(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    narrow = pl.concat([customers(range(1, 5), version=3), customers(range(41, 45))]).with_columns(
        pl.col("seq").cast(pl.Int32)
    )
    res = h.write(spec, narrow, run_id="r2")
    assert (res.rows_updated, res.rows_inserted, res.rows_total_after) == (4, 4, 44)
    before, commits = h.rows(spec), h.commits(spec)
    assert before.schema["seq"] == pl.Int64
    with pytest.raises(SchemaMismatch, match="amount"):
        h.write(spec, customers(range(1, 5)).with_columns(amount=pl.lit("x")), run_id="r3")
    assert_same_multiset(h.rows(spec), before)
    assert h.commits(spec) == commits


# --- the two arms side by side: same counters, same typed contents -------------------------------

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
def test_both_arms_report_the_same_counters_and_contents(pg_db_url, catalog, strategy, windowed):
    native = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    legacy = PostgresStore(pg_db_url)
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


def test_both_arms_read_the_typed_frame_identically(pg_db_url, catalog):
    native = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    legacy = PostgresStore(pg_db_url)
    spec = DatasetSpec(name="typed", primary_key="id")
    native.write(spec, typed_frame())
    legacy.write(spec, typed_frame())
    got_native, got_legacy = native.read(spec), legacy.read(spec)
    assert got_legacy.schema == got_native.schema
    assert_frame_equal(got_legacy, got_native.sort("id"), check_exact=True)
