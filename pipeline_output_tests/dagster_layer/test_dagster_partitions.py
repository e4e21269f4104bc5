"""Dagster's own partitions on `@dataset`, under Dagster's real execution (issue 34): a daily
dataset whose partition 2 is re-materialised with one row deleted, one updated and one new (days
1 and 3 unchanged), a three-day range in one run, a static `eu`/`us` dataset, a multi-partition
one, a row outside its partition refused with nothing written — on both arms.

The computes return rows from `SOURCE`, a plain dict the test edits between runs; the expected
table is that dict's rows (plain polars), never the project's reader of a slice.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import dagster as dg
import polars as pl
import pytest

from pipeline_output import DatasetSpec, build_definitions, dataset
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.services.publish import ResolvedMode
from pipeline_output_tests.dagster_runs import failure_errors, partition_meta
from pipeline_output_tests.oracle import assert_same_multiset

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
DAILY = dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-04")
REGIONS = dg.StaticPartitionsDefinition(["eu", "us"])


def day_rows(day: str, ids: list[int], *, version: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "day": pl.Series([date.fromisoformat(day)] * len(ids), dtype=pl.Date),
            "amount": pl.Series([i * 1.5 + version for i in ids], dtype=pl.Float64),
        }
    )


def defs_for(mode: str, source: dict[str, pl.DataFrame]) -> dg.Definitions:
    """A daily dataset and a regional one reading `source[partition_key]`."""

    @dataset(
        name=f"daily_{mode}",
        primary_key="id",
        mode=mode,  # type: ignore[arg-type]
        partitions_def=DAILY,
        partition_column="day",
    )
    def daily(partition_key: str) -> pl.DataFrame:
        return source[partition_key]

    @dataset(
        name=f"regional_{mode}",
        primary_key="id",
        strategy="replace",
        mode=mode,  # type: ignore[arg-type]
        partitions_def=REGIONS,
        partition_column="region",
    )
    def regional(partition_key: str) -> pl.DataFrame:
        return source[partition_key]

    return build_definitions(datasets=[daily, regional], with_maintenance=False)


def run(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    name: str,
    *keys: str,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """One run of `name` for partition `keys[0]`, or for the range `keys[0]..keys[-1]`."""
    job = defs.resolve_implicit_global_asset_job_def()
    tags = {
        "dagster/asset_partition_range_start": keys[0],
        "dagster/asset_partition_range_end": keys[-1],
    }
    return job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey(name)],
        tags=tags,
        raise_on_error=raise_on_error,
    )


def table(name: str, mode: str) -> pl.DataFrame:
    """The dataset's rows on `mode`'s arm."""
    spec = DatasetSpec(name=name, primary_key=("id",))
    return get_runtime().publisher.read(spec, mode=ResolvedMode(mode, "run config"))  # type: ignore[arg-type]


def materialized_partitions(instance: dg.DagsterInstance, name: str) -> set[str]:
    return set(instance.get_materialized_partitions(dg.AssetKey(name)))


def meta(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    (event, *_) = result.get_asset_materialization_events()
    mat = event.event_specific_data.materialization  # type: ignore[union-attr]
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


@pytest.mark.parametrize("mode", ["iceberg", "pg"])
def test_a_daily_dataset_replaces_one_day_and_leaves_the_others(env, instance, mode):
    source = {DAYS[0]: day_rows(DAYS[0], [1, 2]), DAYS[1]: day_rows(DAYS[1], [3, 4, 5])}
    source[DAYS[2]] = day_rows(DAYS[2], [6, 7])
    defs = defs_for(mode, source)
    name = f"daily_{mode}"

    three = run(defs, instance, name, DAYS[0], DAYS[2])  # a three-day range in one run
    assert three.success and materialized_partitions(instance, name) == set(DAYS)
    per_day = {
        e.partition: e.event_specific_data.materialization.metadata  # type: ignore[union-attr]
        for e in three.get_asset_materialization_events()
    }
    inserted = {k: m["rows_inserted"].value for k, m in per_day.items()}
    assert inserted == {DAYS[0]: 2, DAYS[1]: 3, DAYS[2]: 2}  # each day its own figures
    assert_same_multiset(table(name, mode), pl.concat(source.values()))
    before = table(name, mode)

    # day 2 again: 3 deleted, 4 updated, 5 unchanged, 8 new
    source[DAYS[1]] = pl.concat(
        [day_rows(DAYS[1], [4], version=1), day_rows(DAYS[1], [5]), day_rows(DAYS[1], [8])]
    )
    again = run(defs, instance, name, DAYS[1])
    assert again.success
    m = meta(again)
    assert (m["rows_inserted"], m["rows_updated"], m["rows_deleted"]) == (1, 1, 1)
    assert m["why"] == f"partition {DAYS[1]}" and m["write_mode"] == "sync"
    after = table(name, mode)
    assert_same_multiset(after, pl.concat(source.values()))
    for day in (DAYS[0], DAYS[2]):
        on = pl.col("day") == date.fromisoformat(day)
        assert_same_multiset(after.filter(on), before.filter(on))


@pytest.mark.parametrize("mode", ["iceberg", "pg"])
def test_a_static_eu_us_dataset_replaces_one_region(env, instance, mode):
    source = {
        "eu": pl.DataFrame({"id": [1, 2], "region": ["eu", "eu"], "v": ["a", "b"]}),
        "us": pl.DataFrame({"id": [3], "region": ["us"], "v": ["c"]}),
    }
    defs = defs_for(mode, source)
    name = f"regional_{mode}"
    assert run(defs, instance, name, "eu").success and run(defs, instance, name, "us").success
    source["eu"] = pl.DataFrame({"id": [9], "region": ["eu"], "v": ["z"]})
    m = meta(run(defs, instance, name, "eu"))
    assert (m["rows_inserted"], m["rows_deleted"]) == (1, 2)
    assert_same_multiset(table(name, mode), pl.concat(source.values()))


@pytest.mark.parametrize("mode", ["iceberg", "pg"])
def test_a_row_outside_its_partition_is_refused_with_nothing_written_or_recorded(
    env, instance, mode
):
    source = {d: day_rows(d, [n]) for n, d in enumerate(DAYS)}
    defs = defs_for(mode, source)
    name = f"daily_{mode}"
    assert run(defs, instance, name, DAYS[0]).success
    before = table(name, mode)
    ledger = get_runtime().ledger
    deploys = len(ledger.deploy_log.deploys(name))

    source[DAYS[1]] = pl.concat([day_rows(DAYS[1], [10]), day_rows(DAYS[2], [11])])
    failed = run(defs, instance, name, DAYS[1], raise_on_error=False)
    assert not failed.success
    (failure,) = failed.get_step_failure_events()
    text = failure.event_specific_data.error.to_string()  # type: ignore[union-attr]
    assert failure_errors(failed) == ["RowsOutsideWindow"], text
    assert "outside partition 2024-01-02" in text
    assert materialized_partitions(instance, name) == {DAYS[0]}  # none recorded
    assert_same_multiset(table(name, mode), before)
    assert len(ledger.deploy_log.deploys(name)) == deploys  # no commit on either arm
    if mode == "iceberg":
        iceberg = get_runtime().iceberg.load(name)
        assert iceberg is not None and len(iceberg.snapshots()) == 1


def test_a_multi_partition_dataset_writes_the_intersection_of_day_and_region(env, instance):
    source: dict[str, pl.DataFrame] = {}
    multi = dg.MultiPartitionsDefinition({"date": DAILY, "region": REGIONS})

    @dataset(
        name="sales",
        primary_key="id",
        mode="iceberg",
        partitions_def=multi,
        partition_column={"date": "day", "region": "region"},
    )
    def sales(context: dg.AssetExecutionContext) -> pl.DataFrame:
        key = context.partition_key  # a MultiPartitionKey, as Dagster gives it
        assert isinstance(key, dg.MultiPartitionKey) and set(key.keys_by_dimension) == {
            "date",
            "region",
        }
        return source[key]

    defs = build_definitions(datasets=[sales], with_maintenance=False)
    job = defs.resolve_implicit_global_asset_job_def()

    def rows(key: str, ids: list[int]) -> pl.DataFrame:
        day, region = key.split("|")
        return day_rows(day, ids).with_columns(region=pl.lit(region))

    for key, ids in {"2024-01-01|eu": [1, 2], "2024-01-01|us": [3], "2024-01-02|eu": [4]}.items():
        source[key] = rows(key, ids)
        assert job.execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("sales")], partition_key=key
        ).success
    source["2024-01-01|eu"] = rows("2024-01-01|eu", [5])
    assert job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey("sales")], partition_key="2024-01-01|eu"
    ).success
    got = get_runtime().iceberg.read("sales")
    assert_same_multiset(got.select(source["2024-01-01|us"].columns), pl.concat(source.values()))


def test_a_downstream_partitioned_dataset_reads_only_its_days_slice_in_a_range_run(env, instance):
    source = {d: day_rows(d, [n * 10, n * 10 + 1]) for n, d in enumerate(DAYS)}
    seen: list[tuple[str, int]] = []

    @dataset(primary_key="id", mode="iceberg", partitions_def=DAILY, partition_column="day")
    def orders(partition_key: str) -> pl.DataFrame:
        return source[partition_key]

    @dataset(primary_key="id", mode="iceberg", partitions_def=DAILY, partition_column="day")
    def doubled(orders: pl.LazyFrame, partition_key: str) -> pl.LazyFrame:
        seen.append((partition_key, orders.select(pl.len()).collect().item()))
        return orders.with_columns(amount=pl.col("amount") * 2)

    defs = build_definitions(datasets=[orders, doubled], with_maintenance=False)
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey("orders"), dg.AssetKey("doubled")],
        tags={
            "dagster/asset_partition_range_start": DAYS[0],
            "dagster/asset_partition_range_end": DAYS[2],
        },
    )
    assert result.success
    assert sorted(seen) == [(d, 2) for d in DAYS]  # each call saw its own day only
    expected = pl.concat(source.values()).with_columns(amount=pl.col("amount") * 2)
    assert_same_multiset(get_runtime().iceberg.read("doubled"), expected)


def test_a_dry_run_of_a_partition_reports_its_slice_write_and_writes_nothing(env, instance):
    source = {d: day_rows(d, [n]) for n, d in enumerate(DAYS)}
    defs = defs_for("iceberg", source)
    name = "daily_iceberg"
    assert run(defs, instance, name, DAYS[0]).success
    snapshots = len(get_runtime().iceberg.load(name).snapshots())  # type: ignore[union-attr]
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey(name)],
        partition_key=DAYS[1],
        run_config={"ops": {name: {"config": {"dry_run": True}}}},
    )
    assert result.success and result.get_asset_materialization_events() == []
    (obs,) = [
        e.event_specific_data.asset_observation  # type: ignore[union-attr]
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    ]
    assert obs.partition == DAYS[1]
    assert obs.metadata["write_mode"].value == "sync"
    assert f"partition {DAYS[1]}" in obs.metadata["expected_effect"].value
    assert len(get_runtime().iceberg.load(name).snapshots()) == snapshots  # type: ignore[union-attr]


def ranged_once(instance, mode):  # type: ignore[no-untyped-def]
    """Two rows a day for DAYS, written by one range run of the `mode` dataset: (the source the
    dataset computes from, its definitions, its name)."""
    source = {d: day_rows(d, [n * 10, n * 10 + 1]) for n, d in enumerate(DAYS)}
    defs = defs_for(mode, source)
    name = f"daily_{mode}"
    assert run(defs, instance, name, DAYS[0], DAYS[2]).success
    return source, defs, name


def test_a_compute_failing_in_a_range_run_says_which_partition_and_the_run_stops_there(
    env, instance
):
    source, defs, name = ranged_once(instance, "iceberg")
    before = table(name, "iceberg")
    source[DAYS[0]] = day_rows(DAYS[0], [0, 1], version=1)  # committed before day 2 fails
    del source[DAYS[1]]  # the compute's `source[partition_key]` raises KeyError on day 2
    result = run(defs, instance, name, DAYS[0], DAYS[2], raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error = failure.step_failure_data.error
    while error.cause is not None:  # the compute's own exception, under Dagster's wrapper
        error = error.cause
    assert error.cls_name == "KeyError"
    assert f"(computing partition '{DAYS[1]}' of dataset '{name}')" in error.message
    # one commit per partition (concepts.md, "Dagster partitions"): day 1 written, days 2-3 not
    kept = before.filter(pl.col("day") != date.fromisoformat(DAYS[0]))
    assert_same_multiset(table(name, "iceberg"), pl.concat([source[DAYS[0]], kept]))


@pytest.mark.parametrize("mode", ["iceberg", "pg"])
def test_each_partition_of_a_range_run_records_its_own_write(env, instance, mode):
    source, defs, name = ranged_once(instance, mode)
    source[DAYS[1]] = day_rows(DAYS[1], [10, 11], version=1)  # day 2 changes; days 1 and 3 not
    assert run(defs, instance, name, DAYS[0], DAYS[2]).success

    got = {d: partition_meta(instance, name, d) for d in DAYS}
    for day, m in got.items():
        assert m["why"] == f"partition {day}"
        assert m["noop"] is (day != DAYS[1])
        assert ("note" in m) is (day != DAYS[1])  # a no-op's note only on the no-op days
    changed = got[DAYS[1]]
    assert (changed["write_mode"], changed["rows_updated"], changed["rows_inserted"]) == (
        "sync",
        2,
        0,
    )
    assert {d: m["rows_updated"] for d, m in got.items()} == {DAYS[0]: 0, DAYS[1]: 2, DAYS[2]: 0}
    commit = "iceberg/snapshot_id" if mode == "iceberg" else "pg/deploy_id"
    assert changed[commit] not in (None, "no-op") and got[DAYS[2]][commit] == "no-op"


@pytest.mark.parametrize("mode", ["iceberg", "pg"])
def test_a_range_run_puts_the_table_and_the_run_wide_facts_on_its_last_partition_only(
    env, instance, mode
):
    # every partition's materialisation is serialised and stored: the table's column schema, file
    # counts and the run's lines go once, on the asset's latest materialisation, not on each
    _, _, name = ranged_once(instance, mode)

    got = {d: partition_meta(instance, name, d) for d in DAYS}
    table_keys = {"dagster/column_schema", "partitions"} | (
        {"iceberg/data_files", "iceberg/snapshots"} if mode == "iceberg" else set()
    )
    for day in DAYS[:-1]:
        assert not table_keys & set(got[day]), day
    latest = got[DAYS[-1]]
    assert table_keys <= set(latest)
    assert latest["dagster/row_count"] == 6
    assert all(day in latest["partitions"] for day in DAYS)
    # what is the same for the whole run is said once, on its latest materialisation (90
    # partitions: one copy, not 90 serialised and stored); each partition has its own figures
    run_keys = {"mode", "arms", "run_partitions", "dagster/table_name", "dagster/uri"}
    assert run_keys <= set(latest)
    for day in DAYS[:-1]:
        assert not run_keys & set(got[day]), day
    for m in got.values():
        assert m["dagster/partition_row_count"] == 2
        assert {"why", "noop", "write_mode", "rows_in", "rows_inserted", "rows_deleted"} <= set(m)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_a_range_run_computes_its_partitions_in_the_definitions_order(env, instance, kind):
    calls: list[str] = []
    keys = ["zeta", "mid", "alpha"]
    if kind == "dynamic":
        partitions: Any = dg.DynamicPartitionsDefinition(name="regions")
        instance.add_dynamic_partitions("regions", keys)  # added in this order
    else:
        partitions = dg.StaticPartitionsDefinition(keys)

    @dataset(primary_key="id", mode="iceberg", partitions_def=partitions, partition_column="region")
    def ordered(partition_key: str) -> pl.DataFrame:
        calls.append(partition_key)
        return pl.DataFrame({"id": [len(calls)], "region": [partition_key]})

    defs = build_definitions(datasets=[ordered], with_maintenance=False)
    assert run(defs, instance, "ordered", "zeta", "alpha").success
    assert calls == keys


SPAN = [date(2024, 1, 26 + n).isoformat() for n in range(6)] + [
    date(2024, 2, 1 + n).isoformat() for n in range(6)
]  # 12 days across the January/February boundary
SPAN_DAILY = dg.DailyPartitionsDefinition(start_date=SPAN[0], end_date="2024-02-07")


@pytest.mark.parametrize("mode", ["iceberg", "pg"])
def test_a_plain_downstream_asset_reads_exactly_its_range_of_days(env, instance, mode):
    """A plain `@asset` downstream of a daily dataset, run over 1 day, 7 days across a month
    boundary, and every day, is given exactly those days' rows (dagster-deltalake's class of
    bug: 0 rows for 7 days); the expectation is the computes' rows filtered by plain polars."""
    source = {d: day_rows(d, [n * 10 + 1, n * 10 + 2, n * 10 + 3]) for n, d in enumerate(SPAN)}
    seen: dict[tuple[str, str], pl.DataFrame] = {}

    @dataset(
        name=f"spans_{mode}",
        primary_key="id",
        mode=mode,  # type: ignore[arg-type]
        partitions_def=SPAN_DAILY,
        partition_column="day",
    )
    def spans(partition_key: str) -> pl.DataFrame:
        return source[partition_key]

    @dg.asset(
        name=f"reader_{mode}", partitions_def=SPAN_DAILY, ins={"up": dg.AssetIn(f"spans_{mode}")}
    )
    def reader(context, up: pl.LazyFrame) -> None:  # type: ignore[no-untyped-def]
        keys = sorted(context.partition_keys)
        seen[(keys[0], keys[-1])] = up.collect()

    defs = build_definitions(datasets=[spans], assets=[reader], with_maintenance=False)
    assert run(defs, instance, f"spans_{mode}", SPAN[0], SPAN[-1]).success
    every = pl.concat(source.values())
    for first, last in [(SPAN[7], SPAN[7]), (SPAN[3], SPAN[9]), (SPAN[0], SPAN[-1])]:
        assert run(defs, instance, f"reader_{mode}", first, last).success
        lo, hi = date.fromisoformat(first), date.fromisoformat(last)
        expected = every.filter(pl.col("day").is_between(lo, hi))
        assert_same_multiset(seen[(first, last)].select(every.columns), expected)


def test_a_compute_taking_dagsters_context_sees_the_key_it_computes_in_a_range_run(env, instance):
    """`context` as a Dagster asset takes it: each key's call of a range run sees that key (where
    Dagster's own `context.partition_key` raises), the run's log and run id are the run's; an
    unpartitioned dataset gets the run's context itself."""
    seen: list[tuple[str, list[str], str, str]] = []

    @dataset(
        name="by_context",
        primary_key="id",
        strategy="replace",
        mode="iceberg",
        partitions_def=DAILY,
        partition_column="day",
    )
    def by_context(context: dg.AssetExecutionContext) -> pl.DataFrame:
        window = context.partition_time_window
        seen.append(
            (
                context.partition_key,
                context.partition_keys,
                str(window.start.date()),
                context.run.run_id,
            )
        )
        context.log.info(f"computing {context.partition_key}")
        context.add_output_metadata({"computed_for": context.partition_key})  # its own partition's
        day = context.partition_key
        return day_rows(day, [int(day[-2:])])

    @dataset(name="plain_context", primary_key="id", mode="iceberg")
    def plain_context(context: dg.AssetExecutionContext, by_context: pl.LazyFrame) -> pl.DataFrame:
        assert not context.has_partition_key
        # Dagster's own call: the asset's other outputs (its checks') make it name one
        context.add_output_metadata({"note": "from by_context"})
        return by_context.collect()

    defs = build_definitions(datasets=[by_context, plain_context], with_maintenance=False)
    three = run(defs, instance, "by_context", DAYS[0], DAYS[2])
    assert three.success
    assert [(k, keys, start) for k, keys, start, _ in seen] == [(d, [d], d) for d in DAYS]
    assert {run_id for *_, run_id in seen} == {three.run_id}
    computed_for = {
        e.partition: e.event_specific_data.materialization.metadata["computed_for"].value  # type: ignore[union-attr]
        for e in three.get_asset_materialization_events()
    }
    assert computed_for == {d: d for d in DAYS}
    logged = [e.message for e in instance.all_logs(three.run_id) if "computing" in e.message]
    assert [m.rsplit(" ", 1)[-1] for m in logged] == DAYS
    expected = pl.concat([day_rows(d, [int(d[-2:])]) for d in DAYS])
    assert_same_multiset(table("by_context", "iceberg"), expected)

    job = defs.resolve_implicit_global_asset_job_def()
    down = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("plain_context")])
    assert down.success
    [mat] = down.get_asset_materialization_events()
    assert mat.event_specific_data.materialization.metadata["note"].value == "from by_context"  # type: ignore[union-attr]
    assert_same_multiset(table("plain_context", "iceberg"), expected)


def test_a_partition_runs_write_is_made_ready_while_its_rows_compute(env, instance, monkeypatch):
    """A partition run resolves its mode and loads its table on another thread while the step's
    thread computes the rows (issue 44): here the mode's lookup waits until the compute has
    started — where the write was made ready before the compute, it would wait in vain and the
    run fail. The region is written (the oracle: the computes' rows), and again on a re-run."""
    import threading

    from pipeline_output.services.publish import Publisher
    from pipeline_output.stores.iceberg import IcebergStore

    computing = threading.Event()
    where: dict[str, str] = {}
    resolve, load_ahead = Publisher.resolve, IcebergStore.load_ahead

    def resolve_once_computing(self: Publisher, spec: Any, **kwargs: Any) -> Any:
        if spec.name == "regional_iceberg":
            assert computing.wait(timeout=30), "the mode was resolved before the rows computed"
            where["resolve"] = threading.current_thread().name
        return resolve(self, spec, **kwargs)

    def loading_ahead(self: IcebergStore, spec: Any) -> Any:
        where["load_ahead"] = threading.current_thread().name
        return load_ahead(self, spec)

    monkeypatch.setattr(Publisher, "resolve", resolve_once_computing)
    monkeypatch.setattr(IcebergStore, "load_ahead", loading_ahead)
    source = {"eu": pl.DataFrame({"id": [1, 2], "region": ["eu", "eu"], "v": ["a", "b"]})}

    class Computing(dict):  # type: ignore[type-arg]
        def __getitem__(self, key: str) -> pl.DataFrame:
            where["compute"] = threading.current_thread().name
            computing.set()
            return source[key]

    defs = defs_for("iceberg", Computing())
    for _ in range(2):
        computing.clear()
        assert run(defs, instance, "regional_iceberg", "eu").success
        assert_same_multiset(table("regional_iceberg", "iceberg"), source["eu"])
        assert where["resolve"] == where["load_ahead"] != where["compute"], where
