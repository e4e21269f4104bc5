"""Window sensors at production cadence, on real parts (Postgres source, ledger and Dagster storage of
an instance, pyiceberg SQL catalog): a backlog is requested as a few partition-range runs (each
window once, applied exactly once), a lone new window as one run, windows already in a queued or
running run are not requested again, the runs execute in process unless the code location sets
an executor, a plan never stretches a window past `max_rows`, an idle tick with a cursor never
reads the whole ledger, and a chained delta dataset advances after the dataset it reads.
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest

from pipeline_output import Delta, Window, build_definitions, dataset, postgres_source
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.ledger.window_ledger import WindowLedger
from pipeline_output_tests.dagster_runs import requested_keys, run_request
from pipeline_output_tests.oracle import assert_same_multiset

NAME = "ev_copy"


def make_source(url: str, first: int, last: int) -> None:
    """`public.ev(id, v, seq)` holding one row per seq in first..last (created when missing)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS ev (id bigint PRIMARY KEY, v text, seq bigint)")
        conn.execute(
            "INSERT INTO ev SELECT g, 'v' || g, g FROM generate_series(%s::bigint, %s) g",
            (first, last),
        )


def source_frame(url: str) -> pl.DataFrame:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, v, seq FROM ev ORDER BY id").fetchall()
    return pl.DataFrame(
        rows, schema={"id": pl.Int64, "v": pl.String, "seq": pl.Int64}, orient="row"
    )


def copy_defs(*, max_rows: int | None = 1, per_run: int = 100, **build: Any) -> dg.Definitions:
    """`ev_copy`: an append_always copy of `ev`, one window per `max_rows` source rows."""
    raw = postgres_source("ev", table="ev", watermark="seq")

    @dataset(
        NAME,
        strategy="append_always",
        mode="iceberg",
        delta=Delta(source="ev", watermark="seq", max_rows=max_rows, max_windows_per_run=per_run),
    )
    def ev_copy(ev: pl.LazyFrame) -> pl.LazyFrame:
        return ev.select("id", "v", "seq")

    return build_definitions(datasets=[ev_copy], sources=[raw], **build)


def tick(
    defs: dg.Definitions, instance: dg.DagsterInstance, name: str = NAME, cursor: str | None = None
) -> dg.SensorResult:
    """One evaluation of `<name>__window_sensor`, its partition requests applied (as the daemon)."""
    sensor = defs.get_sensor_def(f"{name}__window_sensor")
    context = dg.build_sensor_context(instance=instance, definitions=defs, cursor=cursor)
    result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return result


def check_applied_once(url: str, n_windows: int) -> None:
    """Every window applied after exactly one attempt, one snapshot each, the table = the source."""
    rows = get_runtime().windows.windows(NAME)
    assert len(rows) == n_windows
    assert all(r.state == "applied" and r.attempts == 1 for r in rows), [
        r for r in rows if r.state != "applied" or r.attempts != 1
    ]
    table = get_runtime().iceberg.load(NAME)
    assert table is not None
    snaps = table.snapshots()
    assert [s.snapshot_id for s in snaps] == [r.iceberg_snapshot_id for r in rows]
    assert_same_multiset(
        get_runtime().iceberg.read(NAME).select("id", "v", "seq"), source_frame(url)
    )


def check_backlog_in_range_runs(url: str, instance: dg.DagsterInstance, n: int, per_run: int):  # type: ignore[no-untyped-def]
    make_source(url, 1, n)
    defs = copy_defs(per_run=per_run)
    result = tick(defs, instance)
    keys = [w.partition_key for w in get_runtime().windows.windows(NAME)]
    assert len(keys) == n
    assert len(result.run_requests) <= -(-n // per_run)
    assert requested_keys(result, instance) == keys, "the requests cover every window once"
    assert all("execution" not in r.run_config for r in result.run_requests)  # the location's
    for request in result.run_requests:
        assert run_request(defs, instance, request).success
    check_applied_once(url, n)

    # one new window afterwards: exactly one run, for that window alone
    make_source(url, n + 1, n + 1)
    [request] = tick(defs, instance).run_requests
    assert request.partition_key == Window(n, n + 1).to_key()
    assert run_request(defs, instance, request).success
    check_applied_once(url, n + 1)
    assert tick(defs, instance).run_requests == []


def test_a_backlog_is_requested_as_range_runs_and_a_new_window_as_one_run(env, instance):
    check_backlog_in_range_runs(env, instance, n=10, per_run=4)


@pytest.mark.slow
def test_a_backlog_of_250_windows_is_at_most_3_runs_applying_each_window_once(env, instance):
    check_backlog_in_range_runs(env, instance, n=250, per_run=100)


def test_windows_of_a_queued_or_running_run_are_not_requested_again(env, instance):
    make_source(env, 1, 6)
    defs = copy_defs()
    initial = tick(defs, instance)
    [first] = initial.run_requests
    keys = requested_keys(initial, instance)
    # the daemon launched it: the run is in progress (tags as the request's)
    job = defs.resolve_implicit_global_asset_job_def()
    run = instance.create_run_for_job(
        job, run_config={}, tags=dict(first.tags), status=dg.DagsterRunStatus.STARTED
    )
    make_source(env, 7, 8)
    second = tick(defs, instance, cursor=initial.cursor)
    assert requested_keys(second, instance) == [Window(6, 7).to_key(), Window(7, 8).to_key()]
    assert not set(keys) & set(requested_keys(second, instance))

    # the run is canceled before it applied anything: the next tick requests its windows again,
    # under a run key Dagster has not seen
    instance.report_run_canceled(run)
    third = tick(defs, instance, cursor=second.cursor)
    assert requested_keys(third, instance)[: len(keys)] == keys
    assert first.run_key not in {r.run_key for r in third.run_requests}


def test_the_default_executor_of_window_runs_is_in_process(env, instance):
    make_source(env, 1, 3)
    defs = copy_defs()
    [request] = tick(defs, instance).run_requests
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.executor_def is dg.in_process_executor  # the location's, for every run
    assert "execution" not in request.run_config
    assert "in_process" in dg.validate_run_config(job, request.run_config)["execution"]
    # a code location that sets its own executor keeps it for window runs too
    own = copy_defs(executor=dg.multiprocess_executor)
    [request] = tick(own, instance).run_requests
    assert "execution" not in request.run_config


def test_a_plan_stops_at_1000_windows_each_within_max_rows_and_continues_on_the_next_tick(
    env, instance
):
    make_source(env, 1, 3000)  # 1,500 windows' worth of rows under max_rows=2
    defs = copy_defs(max_rows=2)
    tick(defs, instance)
    first = get_runtime().windows.windows(NAME)
    assert len(first) == 1000 and first[-1].window.high == 2000
    tick(defs, instance)
    rows = get_runtime().windows.windows(NAME)
    assert len(rows) == 1500 and rows[-1].window.high == 3000
    seqs = source_frame(env)["seq"]
    counts = [int(((seqs > (r.window.low or 0)) & (seqs <= r.window.high)).sum()) for r in rows]
    assert max(counts) <= 2 and sum(counts) == 3000


def test_an_idle_tick_with_a_cursor_reads_only_what_can_change(env, instance, monkeypatch):
    make_source(env, 1, 5)
    defs = copy_defs()
    first = tick(defs, instance)
    for request in first.run_requests:
        run_request(defs, instance, request)
    assert json.loads(first.cursor or "{}")["seq"] == 5

    def whole_ledger(self: WindowLedger, dataset: str) -> Any:
        raise AssertionError(f"an idle tick read every window of {dataset}")

    monkeypatch.setattr(WindowLedger, "windows", whole_ledger)
    idle = tick(defs, instance, cursor=first.cursor)
    assert idle.run_requests == [] and not idle.dynamic_partitions_requests
    make_source(env, 6, 6)
    nxt = tick(defs, instance, cursor=idle.cursor)
    [add] = nxt.dynamic_partitions_requests
    assert list(add.partition_keys) == [Window(5, 6).to_key()], "only the new window's partition"


def chain_defs() -> dg.Definitions:
    """`ev_copy` (delta over the source `ev`, 2 rows a window) and `ev_upper`, a chained delta
    dataset over `ev_copy` on the same watermark."""
    raw = postgres_source("ev", table="ev", watermark="seq")

    @dataset(
        NAME,
        strategy="append_always",
        mode="iceberg",
        delta=Delta(source="ev", watermark="seq", max_rows=2),
    )
    def ev_copy(context: dg.AssetExecutionContext, ev: pl.LazyFrame) -> pl.LazyFrame:
        context.log.info(f"window of run {context.run.run_id}")  # a delta compute takes it too
        return ev.select("id", "v", "seq")

    @dataset(
        "ev_upper",
        strategy="append_always",
        mode="iceberg",
        delta=Delta(source=NAME, watermark="seq"),
    )
    def ev_upper(ev_copy: pl.LazyFrame) -> pl.LazyFrame:
        return ev_copy.with_columns(pl.col("v").str.to_uppercase())

    return build_definitions(datasets=[ev_copy, ev_upper], sources=[raw])


def single(key: str, name: str) -> dg.RunRequest:
    return dg.RunRequest(
        partition_key=key,
        asset_selection=[dg.AssetKey(name)],
        tags={"pipeline-output/dataset": name},
    )


def test_a_chained_delta_dataset_is_planned_and_applied_after_its_upstream(env, instance):
    from pipeline_output.dagster_layer.runner import materialize

    make_source(env, 1, 6)
    defs = chain_defs()
    assert tick(defs, instance, "ev_upper").run_requests == [], "its upstream is not written yet"
    keys = requested_keys(tick(defs, instance), instance)
    assert [Window.from_key(k) for k in keys] == [Window(None, 2), Window(2, 4), Window(4, 6)]

    # the upstream's last window applied first (another run): nothing below it is written yet
    assert run_request(defs, instance, single(keys[2], NAME)).success
    assert tick(defs, instance, "ev_upper").run_requests == []
    # its first window: the chained dataset may read up to there, not to the upstream's max (6)
    assert run_request(defs, instance, single(keys[0], NAME)).success
    [request] = tick(defs, instance, "ev_upper").run_requests
    assert request.partition_key == Window(None, 2).to_key()
    assert run_request(defs, instance, request).success
    assert run_request(defs, instance, single(keys[1], NAME)).success
    result = tick(defs, instance, "ev_upper")
    assert [Window.from_key(k) for k in requested_keys(result, instance)] == [Window(2, 6)]
    [request] = result.run_requests
    assert run_request(defs, instance, request).success
    upper = source_frame(env).with_columns(pl.col("v").str.to_uppercase())
    assert_same_multiset(get_runtime().iceberg.read("ev_upper").select(upper.columns), upper)

    # with its cursor, an idle tick does not read the upstream again; a new upstream window does
    idle = tick(defs, instance, "ev_upper", cursor=result.cursor)
    assert idle.run_requests == []
    make_source(env, 7, 8)
    [request] = tick(defs, instance).run_requests
    assert run_request(defs, instance, request).success
    [request] = tick(defs, instance, "ev_upper", cursor=idle.cursor).run_requests
    assert request.partition_key == Window(6, 8).to_key()

    # `materialize` applies the chain in one call, upstream first
    make_source(env, 9, 9)
    materialize(defs, instance)
    upper = source_frame(env).with_columns(pl.col("v").str.to_uppercase())
    assert_same_multiset(get_runtime().iceberg.read("ev_upper").select(upper.columns), upper)
    assert {w.state for w in get_runtime().windows.windows("ev_upper")} == {"applied"}


def test_a_lookback_run_reads_back_only_the_windows_it_needs(env, instance):
    """`lookback=1`: the window (10, 20] re-reads (-inf, 10], so a row that arrived late there
    (below the last high) is written; the read goes through `WindowLedger.around`, not the whole
    ledger."""
    raw = postgres_source("ev", table="ev", watermark="seq")

    @dataset(
        NAME,
        primary_key="id",
        strategy="snapshot_replace",
        mode="iceberg",
        delta=Delta(source="ev", watermark="seq", lookback=1),
    )
    def ev_copy(ev: pl.LazyFrame) -> pl.LazyFrame:
        return ev.select("id", "v", "seq")

    defs = build_definitions(datasets=[ev_copy], sources=[raw])
    make_source(env, 1, 10)
    [request] = tick(defs, instance).run_requests
    assert run_request(defs, instance, request).success
    with psycopg.connect(env, autocommit=True) as conn:  # a late row inside (-inf, 10]
        conn.execute("INSERT INTO ev VALUES (1000, 'late', 8)")
    make_source(env, 11, 20)
    [request] = tick(defs, instance).run_requests
    assert request.partition_key == Window(10, 20).to_key()
    assert run_request(defs, instance, request).success
    assert_same_multiset(
        get_runtime().iceberg.read(NAME).select("id", "v", "seq"), source_frame(env)
    )


def observed(result: dg.SensorResult) -> list[tuple[Any, Any]]:
    """(row count, high-water mark) of each source observation a tick recorded."""
    return [
        (e.metadata["dagster/row_count"].value, e.metadata["high_water_mark"].value)
        for e in result.asset_events
        if isinstance(e, dg.AssetObservation)
    ]


def refusing(what: str) -> Any:
    """A stand-in for a read an idle tick must not make: fails naming it."""

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError(f"an idle tick {what}")

    return refuse


def test_an_idle_tick_reads_only_the_source_high_water_mark_and_records_nothing(
    env, instance, monkeypatch
):
    """A large legacy table is not counted every tick: with a cursor, a tick whose source's
    `max(watermark)` did not move neither runs `count(*)` nor records an observation; once it
    moves, the source is read and observed again."""
    from pipeline_output.dagster_layer import source_assets

    make_source(env, 1, 3)
    defs = copy_defs()
    first = tick(defs, instance)
    assert observed(first) == [(3, "3")]
    for request in first.run_requests:
        assert run_request(defs, instance, request).success

    with monkeypatch.context() as patched:
        patched.setattr(source_assets, "postgres_stats", refusing("counted the source's rows"))
        idle = tick(defs, instance, cursor=first.cursor)
    assert observed(idle) == [] and idle.run_requests == []
    make_source(env, 4, 4)
    nxt = tick(defs, instance, cursor=idle.cursor)
    assert observed(nxt) == [(4, "4")]
    [request] = nxt.run_requests
    assert request.partition_key == Window(3, 4).to_key()
    assert run_request(defs, instance, request).success
    check_applied_once(env, 4)


def test_an_iceberg_source_is_planned_from_and_an_idle_tick_opens_no_data_file(
    env, instance, monkeypatch
):
    """A delta dataset over an Iceberg source: windows are cut from its watermark column and
    applied; a tick with a cursor on an unchanged table reads only its metadata (the current
    snapshot), and an append is planned on the next tick."""
    import pyarrow as pa

    from pipeline_output import iceberg_source
    from pipeline_output.dagster_layer import source_assets

    catalog = get_runtime().catalog
    catalog.create_namespace_if_not_exists("raw")

    def rows(first: int, last: int) -> pa.Table:
        seq = list(range(first, last + 1))
        return pa.table(
            {
                "id": pa.array(seq, pa.int64()),
                "v": pa.array([f"v{s}" for s in seq], pa.string()),
                "seq": pa.array(seq, pa.int64()),
            }
        )

    table = catalog.create_table("raw.ev", schema=rows(1, 1).schema)
    table.append(rows(1, 4))

    @dataset(
        NAME,
        strategy="append_always",
        mode="iceberg",
        delta=Delta(source="ev_ice", watermark="seq", max_rows=2),
    )
    def ev_copy(ev_ice: pl.LazyFrame) -> pl.LazyFrame:
        return ev_ice.select("id", "v", "seq")

    source = iceberg_source("ev_ice", identifier="raw.ev", watermark="seq")
    defs = build_definitions(datasets=[ev_copy], sources=[source])
    first = tick(defs, instance)
    assert observed(first) == [(4, "4")]
    assert [w.partition_key for w in get_runtime().windows.windows(NAME)] == [
        Window(None, 2).to_key(),
        Window(2, 4).to_key(),
    ]
    for request in first.run_requests:
        assert run_request(defs, instance, request).success

    with monkeypatch.context() as patched:
        patched.setattr(source_assets, "source_stats", refusing("read the source's rows"))
        patched.setattr(source_assets, "scan_source", refusing("scanned the source"))
        idle = tick(defs, instance, cursor=first.cursor)
    assert observed(idle) == [] and idle.run_requests == []
    table.append(rows(5, 5))
    nxt = tick(defs, instance, cursor=idle.cursor)
    [request] = nxt.run_requests
    assert request.partition_key == Window(4, 5).to_key()
    assert run_request(defs, instance, request).success
    expected = pl.from_arrow(catalog.load_table("raw.ev").scan().to_arrow())
    assert isinstance(expected, pl.DataFrame)
    assert_same_multiset(get_runtime().iceberg.read(NAME).select("id", "v", "seq"), expected)
    assert all(w.state == "applied" for w in get_runtime().windows.windows(NAME))
