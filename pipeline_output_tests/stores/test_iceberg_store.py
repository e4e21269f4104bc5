"""The native Iceberg arm's own behaviour against the oracle: snapshots, many data files and
pruning, long string and typed keys, nested and partitioned tables, random write sequences.

The scenarios both arms share (every strategy x first/re-deploy (x window), each write run twice,
windows, NaN/null no-ops, schema evolution) run on both in `test_arm_conformance.py`.
"""

from __future__ import annotations

import os
from datetime import date, timedelta

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output_tests.iceberg_harness import (
    WINDOW,
    base,
    build_in_files,
    customers,
    redeploy_rows,
    spec_for,
)
from pipeline_output_tests.oracle import STRATEGIES
from pipeline_output_tests.stores.arms import composite

# --- no-op writes and snapshot chains -------------------------------------------------------------


def test_append_new_of_only_existing_keys_is_a_noop(h):
    spec = spec_for("append_new")
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, customers(range(5, 15), version=7), run_id="r2")
    assert res.snapshot_id is None
    assert res.rows_skipped == 10


def test_three_successive_upserts_chain_one_snapshot_each(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base(), run_id="a")
    h.write_and_check(spec, redeploy_rows(), run_id="b")
    h.write_and_check(spec, customers(range(55, 70), version=3), run_id="c")
    assert len(h.snapshot_ids(spec)) == 3


# --- freshness oracle ----------------------------------------------------------------------------


def test_existing_table_without_snapshot_is_a_first_deploy(h):
    spec = spec_for("snapshot_replace")
    h.fresh_catalog().create_table(("datasets", "customers"), schema=base().to_arrow().schema)
    res, _ = h.write_and_check(spec, base())
    assert res.first_deploy is True
    assert res.write_mode == "replace"


# --- nulls and NaN do not count as changes -------------------------------------------------------


def test_sync_rerun_with_nan_is_a_noop(h):
    spec = spec_for("sync")
    data = base().with_columns(amount=pl.lit(float("nan")))
    h.write_and_check(spec, data)
    res, _ = h.write_and_check(spec, data, run_id="r2")
    assert res.snapshot_id is None and res.rows_updated == 0


# --- schema evolution ----------------------------------------------------------------------------


def test_dropped_column_on_append_always(h):
    spec = spec_for("append_always")
    h.write_and_check(spec, base())
    h.write_and_check(spec, customers(range(100, 105)).drop("name"), run_id="r2")
    raw = h.raw(spec)
    assert raw.height == 45
    assert raw["name"].null_count() == 5


# --- composite keys ------------------------------------------------------------------------------


def test_composite_key_upsert_of_25k_rows_matches_oracle(h):
    spec = DatasetSpec(name="composite", primary_key=("k_int", "k_str", "k_date"))
    h.write_and_check(spec, composite(0, 30_000))
    # 10k changed, 5k identical, 10k new
    data = pl.concat(
        [composite(0, 10_000, version=1), composite(10_000, 15_000), composite(30_000, 40_000)]
    )
    res, _ = h.write_and_check(spec, data, run_id="r2")
    assert (res.rows_updated, res.rows_unchanged, res.rows_inserted, res.rows_preserved) == (
        10_000,
        5_000,
        10_000,
        15_000,
    )
    assert h.table(spec).schema().identifier_field_names() == {"k_int", "k_str", "k_date"}
    res2, _ = h.write_and_check(spec, data, run_id="r3")
    assert res2.snapshot_id is None


@pytest.mark.slow
def test_upsert_into_200k_row_table_matches_oracle(h):
    spec = spec_for("sync", name="big")
    h.write_and_check(spec, customers(range(200_000)))
    data = pl.concat([customers(range(0, 50_000), version=1), customers(range(190_000, 260_000))])
    h.write_and_check(spec, data, run_id="r2")


# --- many data files: pruning must never skip a file that holds a matched or doomed row ----------


def test_upsert_across_many_files_rewrites_only_files_with_matched_keys(h):
    spec = spec_for("snapshot_replace")
    files = build_in_files(h, spec, [customers(range(k * 100, k * 100 + 100)) for k in range(6)])
    assert files == 6
    # touch keys in the 2nd and 5th files, plus new keys
    data = pl.concat(
        [customers([150, 151], version=1), customers([420], version=1), customers([9000])]
    )
    res, _ = h.write_and_check(spec, data, run_id="touch")
    assert res.rows_updated == 3 and res.rows_inserted == 1
    assert 1 <= res.files_rewritten <= 2


def test_sync_deletes_absent_keys_in_files_the_compute_never_mentions(h):
    spec = spec_for("sync")
    build_in_files(h, spec, [customers(range(k * 10, k * 10 + 10)) for k in range(5)])
    res, _ = h.write_and_check(spec, customers(range(21, 25), version=1), run_id="sync")
    assert res.rows_deleted == 46
    assert sorted(h.raw(spec)["id"].to_list()) == [21, 22, 23, 24]


def test_windowed_sync_and_replace_across_files_inside_partly_and_outside_the_window(h):
    spec = spec_for("sync", delta=True)
    build_in_files(h, spec, [customers(range(k * 10 + 1, k * 10 + 11)) for k in range(5)])
    # window (15, 35]: file 11..20 partly, file 21..30 fully inside, file 31..40 partly
    h.write_and_check(spec, customers([22, 33], version=4), window=Window(15, 35), run_id="w")
    ids = set(h.raw(spec)["id"].to_list())
    assert ids == set(range(1, 16)) | {22, 33} | set(range(36, 51))

    spec_r = DatasetSpec(
        name="events", strategy="replace", delta=Delta(source="raw", watermark="seq")
    )
    build_in_files(h, spec_r, [customers(range(k * 10 + 1, k * 10 + 11)) for k in range(5)])
    h.write_and_check(spec_r, customers([700], seq=[35]), window=Window(15, 35), run_id="w")
    ids = set(h.raw(spec_r)["id"].to_list())
    assert ids == set(range(1, 16)) | {700} | set(range(36, 51))


def test_append_new_across_many_files_skips_keys_of_every_file(h):
    spec = spec_for("append_new")
    build_in_files(h, spec, [customers(range(k * 50, k * 50 + 50)) for k in range(4)])
    data = customers(range(0, 300, 7), version=5)
    res, _ = h.write_and_check(spec, data, run_id="new")
    assert res.rows_skipped == len([i for i in range(0, 300, 7) if i < 200])


def long_keys(ids: list[int], version: int = 0) -> pl.DataFrame:
    # 30+ characters with a 24-character common prefix: Iceberg truncates string bounds to 16.
    return pl.DataFrame(
        {
            "code": [f"customer-account-number-{i:08d}" for i in ids],
            "v": pl.Series([i + version for i in ids], dtype=pl.Int64),
        }
    )


def test_upsert_with_long_string_keys_sharing_a_prefix_across_files(h):
    spec = DatasetSpec(name="codes", primary_key=("code",))
    build_in_files(h, spec, [long_keys(list(range(k * 100, k * 100 + 100))) for k in range(4)])
    data = pl.concat([long_keys([5, 250, 399], version=1), long_keys([1000])])
    res, _ = h.write_and_check(spec, data, run_id="u")
    assert (res.rows_updated, res.rows_inserted) == (3, 1)
    res2, _ = h.write_and_check(spec, data, run_id="u2")
    assert res2.snapshot_id is None


def test_composite_key_upsert_across_files(h):
    spec = DatasetSpec(name="composite", primary_key=("k_int", "k_str", "k_date"))
    build_in_files(h, spec, [composite(k * 2000, (k + 1) * 2000) for k in range(4)])
    data = pl.concat([composite(1990, 2010, version=1), composite(7999, 8001, version=2)])
    res, _ = h.write_and_check(spec, data, run_id="u")
    assert res.rows_updated == 21 and res.rows_inserted == 1


# --- types ---------------------------------------------------------------------------------------


def typed_rows(ids: list[int], version: int = 0) -> pl.DataFrame:
    from datetime import datetime

    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "flag": [i % 2 == 0 for i in ids],
            "small": pl.Series([i % 100 for i in ids], dtype=pl.Int32),
            "ratio": pl.Series([i / 7 + version for i in ids], dtype=pl.Float32),
            "ts": pl.Series(
                [datetime(2024, 5, 1) + timedelta(minutes=i) for i in ids], dtype=pl.Datetime("us")
            ),
            "ts_utc": pl.Series(
                [datetime(2024, 5, 1) + timedelta(seconds=i) for i in ids],
                dtype=pl.Datetime("us", "UTC"),
            ),
            "text": [f"naïve café ✓ {i} {version}" for i in ids],
            "blob": [bytes([i % 256, version]) for i in ids],
        }
    )


def test_many_column_types_roundtrip_and_upsert_rerun_is_a_noop(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, typed_rows(list(range(50))))
    data = pl.concat([typed_rows(list(range(40, 50)), version=1), typed_rows(list(range(50, 55)))])
    res, _ = h.write_and_check(spec, data, run_id="u")
    assert (res.rows_updated, res.rows_inserted) == (10, 5)
    res2, _ = h.write_and_check(spec, data, run_id="u2")
    assert res2.snapshot_id is None


def test_nested_list_and_struct_columns_upsert_and_rerun_is_a_noop(h):
    spec = spec_for("sync")

    def rows(ids: list[int], version: int = 0) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "id": pl.Series(ids, dtype=pl.Int64),
                "tags": [[f"t{i}", f"v{version}"] for i in ids],
                "addr": [{"city": f"c{i}", "zip": i + version} for i in ids],
            }
        )

    h.write_and_check(spec, rows(list(range(10))))
    data = pl.concat([rows([1, 2], version=1), rows(list(range(3, 12)))])
    res, _ = h.write_and_check(spec, data, run_id="s")
    assert (res.rows_updated, res.rows_inserted, res.rows_deleted) == (2, 2, 1)
    res2, _ = h.write_and_check(spec, data, run_id="s2")
    assert res2.snapshot_id is None


def test_compute_columns_in_a_different_order_upsert_correctly(h):
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, base())
    data = redeploy_rows()
    shuffled = data.select(["seq", "amount", "id", "day", "name"])
    res, _ = h.write_and_check(spec, shuffled, run_id="u")
    assert (res.rows_updated, res.rows_unchanged) == (10, 10)


def test_partitioned_dataset_upsert_matches_oracle(h):
    spec = DatasetSpec(name="parts", primary_key=("id",), partition_by=("name",))
    data = customers(range(30)).with_columns(name=pl.format("p{}", pl.col("id") % 3))
    h.write_and_check(spec, data)
    data2 = customers(range(20, 40), version=1).with_columns(
        name=pl.format("p{}", pl.col("id") % 3)
    )
    h.write_and_check(spec, data2, run_id="u")
    h.write_and_check(spec, data2, run_id="u2")


def test_categorical_key_and_small_int_columns_are_normalised_and_upsert(h):
    spec = DatasetSpec(name="cats", primary_key=("code",))
    data = pl.DataFrame(
        {"code": pl.Series(["a", "b", "c"], dtype=pl.Categorical), "n": [1, 2, 3]}
    ).with_columns(pl.col("n").cast(pl.Int16))
    h.store().write(spec, data)
    again = pl.DataFrame(
        {"code": pl.Series(["b", "d"], dtype=pl.Categorical), "n": [2, 4]}
    ).with_columns(pl.col("n").cast(pl.Int16))
    res = h.store().write(spec, again, run_id="r2")
    assert (res.rows_unchanged, res.rows_inserted, res.rows_updated) == (1, 1, 0)
    assert sorted(h.raw(spec)["code"].to_list()) == ["a", "b", "c", "d"]


# --- random write sequences against the oracle ---------------------------------------------------

_counter = iter(range(10**6))


@st.composite
def write_sequences(draw):
    strategy = draw(st.sampled_from(STRATEGIES))
    writes = []
    for _ in range(draw(st.integers(2, 3))):
        ids = draw(st.lists(st.integers(0, 24), unique=True, max_size=14))
        versions = draw(st.lists(st.integers(0, 2), min_size=len(ids), max_size=len(ids)))
        nulls = draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
        window = None
        if writes and draw(st.booleans()):
            # watermarks are non-negative sequences (Window refuses negative integer bounds)
            low = draw(st.one_of(st.none(), st.integers(0, 20)))
            high = draw(st.integers((low if low is not None else -1) + 1, 26))
            window = (low, high)
        writes.append((ids, versions, nulls, window))
    return strategy, writes


@settings(
    max_examples=int(os.environ.get("PO_HYPOTHESIS_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=write_sequences())
def test_random_write_sequences_match_the_oracle(h, case):
    strategy, writes = case
    spec = DatasetSpec(
        name=f"rand{next(_counter)}",
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        delta=Delta(source="raw", watermark="seq"),
    )
    for n, (ids, versions, nulls, window) in enumerate(writes):
        frame = pl.DataFrame(
            {
                "id": pl.Series(ids, dtype=pl.Int64),
                "seq": pl.Series(ids, dtype=pl.Int64),
                "v": pl.Series(
                    [
                        None if z else i * 10 + v
                        for i, v, z in zip(ids, versions, nulls, strict=True)
                    ],
                    dtype=pl.Int64,
                ),
                "f": pl.Series(
                    [float("nan") if v == 2 else float(v) for v in versions], dtype=pl.Float64
                ),
            }
        )
        w = None
        if window is not None:
            w = Window(low=window[0], high=window[1])
            frame = frame.filter(w.contains("seq"))
        if strategy in ("replace", "sync") and frame.height == 0 and n > 0:
            continue  # empty replace/sync of a non-empty target is refused (tested elsewhere)
        h.write_and_check(spec, frame, window=w, run_id=f"r{n}")


def _key_values(kind: str, n: int) -> pl.Series:
    from datetime import datetime

    i = list(range(n))
    if kind == "negative_int64":
        return pl.Series("k", [x - 10_000 for x in i], dtype=pl.Int64)
    if kind == "int32":
        return pl.Series("k", [x * 3 for x in i], dtype=pl.Int32)
    if kind == "unicode_long_string":
        return pl.Series("k", [f"ééééééééé-ключ-{x:06d}" for x in i], dtype=pl.String)
    if kind == "date":
        return pl.Series("k", [date(1969, 12, 1) + timedelta(days=x) for x in i], dtype=pl.Date)
    if kind == "timestamp":
        ts = [datetime(1969, 12, 31, 23) + timedelta(seconds=x * 7) for x in i]
        return pl.Series("k", ts, dtype=pl.Datetime("us"))
    if kind == "timestamptz":
        ts = [datetime(2024, 3, 1) + timedelta(microseconds=x * 13) for x in i]
        return pl.Series("k", ts, dtype=pl.Datetime("us", "UTC"))
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("negative_int64", marks=pytest.mark.slow),
        pytest.param("int32", marks=pytest.mark.slow),
        "unicode_long_string",
        "date",
        pytest.param("timestamp", marks=pytest.mark.slow),
        "timestamptz",
    ],
)
def test_upsert_and_sync_across_files_for_key_type(h, kind):
    keys = _key_values(kind, 90)

    def rows(idx: list[int], version: int = 0) -> pl.DataFrame:
        return pl.DataFrame({"k": keys.gather(idx), "v": [x + version for x in idx]})

    spec = DatasetSpec(name="keyed", primary_key=("k",))
    build_in_files(h, spec, [rows(list(range(c * 30, c * 30 + 30))) for c in range(3)])
    data = rows([31, 45, 59], version=1)
    res, _ = h.write_and_check(spec, data, run_id="u")
    assert res.rows_updated == 3
    res2, _ = h.write_and_check(spec, data, run_id="u2")
    assert res2.snapshot_id is None
    sync = DatasetSpec(name="keyed", primary_key=("k",), strategy="sync")
    h.write_and_check(sync, rows([0, 31, 89], version=2), run_id="s")
    assert h.raw(spec).height == 3


def test_windowed_sync_updates_a_row_whose_watermark_moved_into_the_window(h):
    spec = spec_for("sync", delta=True)
    h.write_and_check(spec, base(), run_id="r0")
    moved = customers([30], seq=[15], version=3)  # target id 30 has seq 30 (outside)
    res, _ = h.write_and_check(spec, pl.concat([customers([12]), moved]), window=WINDOW, run_id="w")
    assert res.rows_updated == 1
    table = h.raw(spec)
    assert table.filter(pl.col("id") == 30)["seq"].to_list() == [15]
    assert table.group_by("id").len()["len"].max() == 1
