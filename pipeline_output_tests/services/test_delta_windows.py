"""Delta windows end to end on real parts: a real Postgres (sources, ledger, Dagster-free control
plane), a real pyiceberg SQL catalog, Dagster's sensor test utilities against a real instance, and
in-process runs of the real asset job.

Covers the window boundaries `(low, high]` (source pushdown and windowed writes), partition keys,
first-window/`start`/`max_rows` planning, the database constraints of the window ledger, the window
sensor (planning, re-requests, reconciliation), the demo scenario against an independent polars
oracle, and exactly-once re-materialisation / restatement.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from psycopg import sql

from pipeline_output import Delta, Window, build_definitions, dataset, postgres_source
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.errors import InvalidSpec
from pipeline_output_tests.dagster_runs import requested_keys
from pipeline_output_tests.oracle import assert_same_multiset

# --- helpers ---------------------------------------------------------------------------------------


def _key(value: int) -> str:
    """The ledger/partition encoding of an integer bound, written out independently."""
    return f"{value:020d}"


def make_source(url: str, seqs: list[int], *, table: str = "ev", start_id: int = 1) -> None:
    """(Re)create `public.<table>(id, v, seq)` with one row per `seqs` value."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text NOT NULL, seq bigint)").format(
                sql.Identifier(table)
            )
        )
    add_rows(url, seqs, table=table, start_id=start_id)


def add_rows(url: str, seqs: list[int], *, table: str = "ev", start_id: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {} (id, v, seq) VALUES (%s, %s, %s)").format(
                sql.Identifier(table)
            ),
            [(start_id + i, f"v{start_id + i}", s) for i, s in enumerate(seqs)],
        )


def source_frame(url: str, table: str = "ev") -> pl.DataFrame:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, v, seq FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
    return pl.DataFrame(
        rows, schema={"id": pl.Int64, "v": pl.String, "seq": pl.Int64}, orient="row"
    )


def events_defs(
    *,
    name: str = "ev_copy",
    strategy: str = "append_always",
    primary_key: tuple[str, ...] = (),
    max_rows: int | None = None,
    start: int | None = None,
    seen: list[pl.DataFrame] | None = None,
    fail: dict[str, bool] | None = None,
) -> dg.Definitions:
    """One delta dataset over `public.ev` (a plain copy); `seen` records what the compute got."""
    raw = postgres_source("ev", table="ev", watermark="seq")

    def compute(ev: pl.LazyFrame) -> pl.DataFrame:
        frame = ev.select("id", "v", "seq").collect()
        if seen is not None:
            seen.append(frame)
        if fail is not None and fail.get("now"):
            raise RuntimeError("injected compute failure")
        return frame

    asset = dataset(
        name,
        primary_key=primary_key,
        strategy=strategy,  # type: ignore[arg-type]
        mode="iceberg",
        delta=Delta(source="ev", watermark="seq", max_rows=max_rows, start=start),
    )(compute)
    return build_definitions(datasets=[asset], sources=[raw])


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, name: str) -> dg.SensorResult:
    """Evaluate `<name>__window_sensor` once with Dagster's sensor test context and apply its
    dynamic-partition requests to the instance (what the daemon does)."""
    sensor = defs.get_sensor_def(f"{name}__window_sensor")
    result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    assert isinstance(result, dg.SensorResult)
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return result


def run_window(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    name: str,
    key: str,
    *,
    restate: bool = False,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_implicit_global_asset_job_def()
    run_config = {"ops": {name: {"config": {"restate": True}}}} if restate else None
    return job.execute_in_process(
        instance=instance,
        partition_key=key,
        asset_selection=[dg.AssetKey(name)],
        run_config=run_config,
        raise_on_error=raise_on_error,
    )


def run_range(
    defs: dg.Definitions, instance: dg.DagsterInstance, name: str, keys: list[str]
) -> dg.ExecuteInProcessResult:
    """A single-run backfill of the partition range first..last."""
    ordered = sorted(keys)
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey(name)],
        tags={
            "dagster/asset_partition_range_start": ordered[0],
            "dagster/asset_partition_range_end": ordered[-1],
        },
    )


def materialization_meta(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    events = result.get_asset_materialization_events()
    assert events, "the run recorded no materialisation"
    meta = events[-1].materialization.metadata
    return {k: getattr(v, "value", v) for k, v in meta.items()}


def table_rows(name: str) -> pl.DataFrame:
    return get_runtime().iceberg.read(name).select("id", "v", "seq")


def snapshots(name: str) -> list[Any]:
    table = get_runtime().iceberg.load(name)
    assert table is not None
    return list(table.snapshots())


# --- the window value object and its keys ---------------------------------------------------------


def test_window_contains_excludes_low_and_includes_high():
    w = Window(low=10, high=20)
    assert not w.contains_value(10)
    assert w.contains_value(11)
    assert w.contains_value(20)
    assert not w.contains_value(21)
    frame = pl.DataFrame({"seq": [9, 10, 11, 19, 20, 21]})
    assert frame.filter(w.contains("seq"))["seq"].to_list() == [11, 19, 20]
    open_bottom = Window(low=None, high=20)
    assert frame.filter(open_bottom.contains("seq"))["seq"].to_list() == [9, 10, 11, 19, 20]


@pytest.mark.parametrize(
    "windows",
    [
        [Window(None, 3), Window(3, 10), Window(10, 99), Window(99, 12345678901234)],
        [
            Window(None, datetime(2026, 1, 1, 0, 0, 0, 1)),
            Window(datetime(2026, 1, 1, 0, 0, 0, 1), datetime(2026, 1, 9, 23, 59, 59)),
            Window(datetime(2026, 1, 9, 23, 59, 59), datetime(2026, 1, 10)),
            Window(datetime(2026, 1, 10), datetime(2027, 12, 31, 12)),
        ],
        [Window(None, date(2025, 12, 31)), Window(date(2025, 12, 31), date(2026, 2, 1))],
    ],
    ids=["int", "datetime", "date"],
)
def test_partition_keys_round_trip_and_sort_in_window_order(windows):
    keys = [w.to_key() for w in windows]
    assert [Window.from_key(k) for k in keys] == windows
    assert sorted(keys) == keys, "key order must be watermark order (open bottom first)"
    assert all(".." in k for k in keys)
    assert keys[0].startswith(".."), "the open-bottom window's key has an empty low"


def test_int_keys_are_zero_padded_and_readable():
    assert Window(7, 1000).to_key() == f"{_key(7)}..{_key(1000)}"
    assert Window(None, 5).to_key() == f"..{_key(5)}"


def test_aware_datetime_keys_keep_their_zone_as_utc_z():
    plus2 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    key = Window(None, plus2).to_key()
    assert key == "..2026-03-01T14:00:00.000000Z"
    decoded = Window.from_key(key).high
    assert decoded == datetime(2026, 3, 1, 14, 0, tzinfo=UTC)
    assert decoded.tzinfo is not None, "an aware bound decodes aware: the zone survives the key"


def test_naive_datetime_keys_stay_naive():
    key = Window(None, datetime(2026, 3, 1, 14, 0)).to_key()
    assert key == "..2026-03-01T14:00:00.000000"
    assert Window.from_key(key).high.tzinfo is None


@pytest.mark.parametrize("bad", ["", "12", "..", "x..y", "00000000000000000009..abc"])
def test_malformed_partition_keys_are_refused(bad):
    with pytest.raises(InvalidSpec):
        Window.from_key(bad)


# --- windows end to end: source pushdown, first window, start, max_rows --------------------------


def test_window_read_pushdown_low_excluded_high_included(env, instance):
    """Windows planned by hand on the ledger: (-inf,10], (10,20], (20,30]; source rows sit exactly
    on the bounds. The compute of (10,20] sees 11 and 20, never 10 or 21; so does the table."""
    make_source(env, [1, 10, 11, 20, 21, 30])
    seen: list[pl.DataFrame] = []
    defs = events_defs(seen=seen)
    windows = [Window(None, 10), Window(10, 20), Window(20, 30)]
    get_runtime().windows.plan("ev_copy", windows)
    instance.add_dynamic_partitions("ev_copy__windows", [w.to_key() for w in windows])

    run_window(defs, instance, "ev_copy", Window(10, 20).to_key())
    assert sorted(seen[-1]["seq"].to_list()) == [11, 20]
    assert sorted(table_rows("ev_copy")["seq"].to_list()) == [11, 20]

    run_window(defs, instance, "ev_copy", Window(None, 10).to_key())
    assert sorted(seen[-1]["seq"].to_list()) == [1, 10], "open bottom includes the minimum row"
    run_window(defs, instance, "ev_copy", Window(20, 30).to_key())
    assert sorted(seen[-1]["seq"].to_list()) == [21, 30]
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))
    snap = snapshots("ev_copy")[-1]
    assert snap.summary["pipeline-output.window-key"] == Window(20, 30).to_key()


def test_first_window_is_open_at_the_bottom_and_includes_the_minimum_row(env, instance):
    make_source(env, [0, 5, 6, 7])
    seen: list[pl.DataFrame] = []
    defs = events_defs(seen=seen)
    result = tick(defs, instance, "ev_copy")
    assert [r.partition_key for r in result.run_requests] == [f"..{_key(7)}"]
    run_window(defs, instance, "ev_copy", result.run_requests[0].partition_key)
    assert sorted(seen[-1]["seq"].to_list()) == [0, 5, 6, 7]
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))


def test_start_is_respected_rows_at_or_below_start_are_not_read(env, instance):
    make_source(env, [1, 4, 5, 6, 9])
    seen: list[pl.DataFrame] = []
    defs = events_defs(start=5, seen=seen)
    result = tick(defs, instance, "ev_copy")
    assert [r.partition_key for r in result.run_requests] == [f"{_key(5)}..{_key(9)}"]
    run_window(defs, instance, "ev_copy", result.run_requests[0].partition_key)
    assert sorted(seen[-1]["seq"].to_list()) == [6, 9]
    assert sorted(table_rows("ev_copy")["seq"].to_list()) == [6, 9]


def test_start_at_or_above_the_high_water_mark_plans_nothing(env, instance):
    make_source(env, [1, 2, 3])
    defs = events_defs(start=3)
    result = tick(defs, instance, "ev_copy")
    assert result.run_requests == []
    assert get_runtime().windows.windows("ev_copy") == []


def test_max_rows_cuts_history_into_several_windows_covering_every_row(env, instance):
    make_source(env, list(range(1, 101)))
    defs = events_defs(max_rows=30)
    result = tick(defs, instance, "ev_copy")
    keys = requested_keys(result, instance)
    assert [Window.from_key(k) for k in keys] == [
        Window(None, 30),
        Window(30, 60),
        Window(60, 90),
        Window(90, 100),
    ]
    out = run_range(defs, instance, "ev_copy", keys)
    assert out.success
    ledger = get_runtime().windows.windows("ev_copy")
    assert [w.state for w in ledger] == ["applied"] * 4
    assert [w.rows_read for w in ledger] == [30, 30, 30, 10]
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))
    ids = {s.snapshot_id for s in snapshots("ev_copy")}
    assert {w.iceberg_snapshot_id for w in ledger} <= ids
    assert len(snapshots("ev_copy")) == 4


def test_max_rows_keeps_rows_sharing_a_watermark_value_in_one_window(env, instance):
    # seq 2 is shared by three rows: the first window holds all of them (more than max_rows).
    make_source(env, [1, 2, 2, 2, 3, 4, 5])
    defs = events_defs(max_rows=2)
    result = tick(defs, instance, "ev_copy")
    keys = requested_keys(result, instance)
    assert [Window.from_key(k) for k in keys] == [Window(None, 2), Window(2, 4), Window(4, 5)]
    run_range(defs, instance, "ev_copy", keys)
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))


# --- the ledger's own constraints (raw SQL, after migrations) ---------------------------------


_INSERT = (
    "INSERT INTO pipeline_output.windows "
    "(dataset, seq, low_key, high_key, prev_high_key, partition_key) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)


def _insert(url: str, seq: int, low: int | None, high: int, prev: int | None) -> None:
    low_key = _key(low) if low is not None else None
    part = f"{low_key or ''}..{_key(high)}"
    prev_key = _key(prev) if prev is not None else None
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_INSERT, ("d", seq, low_key, _key(high), prev_key, part))


@pytest.fixture
def chain(env: str) -> str:
    """Dataset `d` with windows (-inf, 10] and (10, 20], inserted with plain SQL."""
    _insert(env, 1, None, 10, None)
    _insert(env, 2, 10, 20, 10)
    return env


def test_ledger_accepts_a_contiguous_window_inserted_with_sql(chain):
    _insert(chain, 3, 20, 30, 20)
    with psycopg.connect(chain) as conn:
        n = conn.execute("SELECT count(*) FROM pipeline_output.windows WHERE dataset = 'd'")
        assert n.fetchone()[0] == 3


@pytest.mark.parametrize(
    ("seq", "low", "high", "prev", "error", "constraint"),
    [
        # a gap: starts at 25 although the last window ends at 20 (and says so)
        (3, 25, 30, 20, psycopg.errors.CheckViolation, "windows_contiguous"),
        # a gap that lies about its predecessor: no window ends at 25
        (3, 25, 30, 25, psycopg.errors.ForeignKeyViolation, "windows_chain"),
        # a second window open at the bottom
        (3, None, 30, None, psycopg.errors.CheckViolation, "windows_first_has_no_prev"),
    ],
    ids=["gap", "gap-with-bogus-predecessor", "second-open-bottom"],
)
def test_ledger_rejects_a_non_contiguous_window_inserted_with_sql(
    chain, seq, low, high, prev, error, constraint
):
    with pytest.raises(error) as info:
        _insert(chain, seq, low, high, prev)
    assert info.value.diag.constraint_name == constraint


@pytest.mark.parametrize(
    ("seq", "low", "high", "prev", "error", "constraint"),
    [
        # overlaps (10, 20]: starts at 10 again
        (3, 10, 30, 10, psycopg.errors.UniqueViolation, "windows_unique_low"),
        # overlaps (10, 20]: starts inside it, claiming the correct predecessor
        (3, 15, 30, 20, psycopg.errors.CheckViolation, "windows_contiguous"),
        # overlaps (10, 20] and (-inf, 10]: starts at 5
        (3, 5, 30, 10, psycopg.errors.CheckViolation, "windows_contiguous"),
        # (15, 20]: ends where (10, 20] ends
        (3, 20, 20, 20, psycopg.errors.CheckViolation, "windows_low_below_high"),
        # a second first window overlapping everything
        (1, None, 40, None, psycopg.errors.UniqueViolation, None),
        # runs backwards
        (3, 20, 15, 20, psycopg.errors.CheckViolation, "windows_low_below_high"),
    ],
    ids=[
        "same-start",
        "starts-inside",
        "starts-below",
        "empty",
        "second-first",
        "backwards",
    ],
)
def test_ledger_rejects_an_overlapping_window_inserted_with_sql(
    chain, seq, low, high, prev, error, constraint
):
    with pytest.raises(error) as info:
        _insert(chain, seq, low, high, prev)
    if constraint is not None:
        assert info.value.diag.constraint_name == constraint
    with psycopg.connect(chain) as conn:
        n = conn.execute("SELECT count(*) FROM pipeline_output.windows WHERE dataset = 'd'")
        assert n.fetchone()[0] == 2


def test_ledger_windows_of_different_datasets_are_independent(chain):
    with psycopg.connect(chain, autocommit=True) as conn:
        conn.execute(_INSERT, ("other", 1, None, _key(10), None, f"..{_key(10)}"))


# --- the window sensor -----------------------------------------------------------------------------


def test_sensor_plans_windows_adds_partitions_and_requests_one_range_run_for_them(env, instance):
    make_source(env, list(range(1, 26)))
    defs = events_defs(max_rows=10)
    result = tick(defs, instance, "ev_copy")
    expected = [Window(None, 10), Window(10, 20), Window(20, 25)]
    keys = [w.to_key() for w in expected]
    assert [w.window for w in get_runtime().windows.windows("ev_copy")] == expected
    assert all(w.state == "planned" for w in get_runtime().windows.windows("ev_copy"))
    [add] = result.dynamic_partitions_requests
    assert add.partitions_def_name == "ev_copy__windows"
    assert sorted(add.partition_keys) == keys
    assert sorted(instance.get_dynamic_partitions("ev_copy__windows")) == keys
    # consecutive windows: one partition-range run over the three
    [request] = result.run_requests
    assert request.partition_key is None
    assert request.partition_key_range == dg.PartitionKeyRange(keys[0], keys[-1])
    assert requested_keys(result, instance) == keys
    assert request.asset_selection == [dg.AssetKey("ev_copy")]
    assert request.tags["pipeline-output/dataset"] == "ev_copy"

    # A second evaluation plans nothing new: same ledger, no partition to add, same run keys
    # (Dagster de-duplicates launches by run key).
    again = tick(defs, instance, "ev_copy")
    assert not again.dynamic_partitions_requests
    assert [w.window for w in get_runtime().windows.windows("ev_copy")] == expected
    assert {r.run_key for r in again.run_requests} == {r.run_key for r in result.run_requests}

    # Once applied, the windows are no longer requested.
    run_range(defs, instance, "ev_copy", keys)
    assert tick(defs, instance, "ev_copy").run_requests == []

    # A source insert: the next window (25, 27] is planned and requested.
    add_rows(env, [26, 27], start_id=100)
    nxt = tick(defs, instance, "ev_copy")
    assert [r.partition_key for r in nxt.run_requests] == [Window(25, 27).to_key()]
    assert [w.window for w in get_runtime().windows.windows("ev_copy")][-1] == Window(25, 27)
    assert Window(25, 27).to_key() in instance.get_dynamic_partitions("ev_copy__windows")


def test_sensor_re_requests_a_failed_window_with_a_new_run_key(env, instance):
    make_source(env, [1, 2, 3])
    fail = {"now": True}
    defs = events_defs(fail=fail)
    first = tick(defs, instance, "ev_copy")
    [req] = first.run_requests
    out = run_window(defs, instance, "ev_copy", req.partition_key, raise_on_error=False)
    assert not out.success
    [row] = get_runtime().windows.windows("ev_copy")
    assert row.state == "failed"
    assert "injected compute failure" in (row.error or "")
    assert get_runtime().iceberg.load("ev_copy") is None, "a failed window writes nothing"

    second = tick(defs, instance, "ev_copy")
    [again] = second.run_requests
    assert again.partition_key == req.partition_key
    assert again.run_key != req.run_key

    fail["now"] = False
    assert run_window(defs, instance, "ev_copy", again.partition_key).success
    assert get_runtime().windows.windows("ev_copy")[0].state == "applied"
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))
    assert tick(defs, instance, "ev_copy").run_requests == []


def test_sensor_reconciles_a_crash_between_planning_and_adding_partitions(env, instance):
    """The previous evaluation recorded windows in the ledger and died before the partitions were
    added: the next tick adds them and requests their runs, without planning anything twice."""
    make_source(env, list(range(1, 21)))
    defs = events_defs(max_rows=10)
    planned = get_runtime().windows.plan("ev_copy", [Window(None, 10), Window(10, 20)])
    assert instance.get_dynamic_partitions("ev_copy__windows") == []

    result = tick(defs, instance, "ev_copy")
    keys = [w.partition_key for w in planned]
    [add] = result.dynamic_partitions_requests
    assert sorted(add.partition_keys) == keys
    assert requested_keys(result, instance) == keys
    assert [w.partition_key for w in get_runtime().windows.windows("ev_copy")] == keys

    # and with the source moved on since, the reconciled tick also plans the next window once
    add_rows(env, [21], start_id=100)
    result = tick(defs, instance, "ev_copy")
    assert [w.window for w in get_runtime().windows.windows("ev_copy")] == [
        Window(None, 10),
        Window(10, 20),
        Window(20, 21),
    ]
    run_range(defs, instance, "ev_copy", requested_keys(result, instance))
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))


@pytest.mark.slow
def test_sensor_with_a_postgres_backed_instance(env, tmp_path):
    """The same planning against a Dagster instance on the real Postgres (run storage, partitions)."""
    from pipeline_output.infra.settings import to_sqlalchemy_url

    url = to_sqlalchemy_url(env, driver="psycopg2")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url: " + repr(url) + "\ntelemetry:\n  enabled: false\n"
    )
    make_source(env, [1, 2, 3, 4])
    defs = events_defs(max_rows=2)
    with dg.DagsterInstance.from_config(str(home)) as inst:
        result = tick(defs, inst, "ev_copy")
        keys = requested_keys(result, inst)
        assert [Window.from_key(k) for k in keys] == [Window(None, 2), Window(2, 4)]
        assert sorted(inst.get_dynamic_partitions("ev_copy__windows")) == keys
        assert run_range(defs, inst, "ev_copy", keys).success
        assert tick(defs, inst, "ev_copy").run_requests == []
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))


# --- exactly once: re-materialisation and restatement -----------------------------------------


def test_rematerialising_an_applied_append_always_window_is_a_noop_that_says_so(env, instance):
    make_source(env, list(range(1, 11)))
    defs = events_defs(max_rows=5)
    keys = requested_keys(tick(defs, instance, "ev_copy"), instance)
    run_range(defs, instance, "ev_copy", keys)
    before = [s.snapshot_id for s in snapshots("ev_copy")]

    out = run_window(defs, instance, "ev_copy", keys[0])
    meta = materialization_meta(out)
    assert meta["windows_skipped"] == 1 and meta["windows_applied"] == 0
    assert "no-op" in meta["note"]
    logs = [
        e.message
        for e in instance.all_logs(out.run_id)
        if e.user_message and "already applied" in e.user_message
    ]
    assert logs, "the run log says the window was already applied"
    assert [s.snapshot_id for s in snapshots("ev_copy")] == before
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))

    # a single-run backfill over both applied windows: no-op too
    run_range(defs, instance, "ev_copy", keys)
    assert [s.snapshot_id for s in snapshots("ev_copy")] == before
    assert table_rows("ev_copy").height == 10


def test_restate_replaces_exactly_that_windows_rows_in_one_commit(env, instance):
    make_source(env, list(range(1, 16)))
    defs = events_defs(max_rows=5)
    keys = requested_keys(tick(defs, instance, "ev_copy"), instance)
    assert len(keys) == 3
    run_range(defs, instance, "ev_copy", keys)
    n_before = len(snapshots("ev_copy"))

    # corrections inside window 2 (6..10) and, as a control, in window 3 (not restated)
    with psycopg.connect(env, autocommit=True) as conn:
        conn.execute("UPDATE ev SET v = v || '-fixed' WHERE seq IN (6, 8, 10, 12)")
        conn.execute("DELETE FROM ev WHERE seq = 7")

    out = run_window(defs, instance, "ev_copy", keys[1], restate=True)
    meta = materialization_meta(out)
    assert meta["windows_applied"] == 1
    snaps = snapshots("ev_copy")
    assert len(snaps) == n_before + 1, "a restatement is one commit"
    assert snaps[-1].summary["pipeline-output.window-key"] == keys[1]

    got = table_rows("ev_copy")
    src = source_frame(env)
    expected = pl.concat(
        [
            src.filter(pl.col("seq").is_between(6, 10)),
            # outside the restated window the table keeps what it had (12 is not "-fixed")
            src.filter(~pl.col("seq").is_between(6, 10)).with_columns(
                pl.format("v{}", pl.col("id")).alias("v")
            ),
        ]
    )
    assert_same_multiset(got, expected)
    assert 7 not in got["seq"].to_list()
    row = get_runtime().windows.get("ev_copy", keys[1])
    assert row is not None and row.state == "applied"
    assert row.iceberg_snapshot_id == snaps[-1].snapshot_id

    # a plain re-run after the restatement is again a no-op
    run_window(defs, instance, "ev_copy", keys[1])
    assert len(snapshots("ev_copy")) == n_before + 1


# --- the demo scenario against an independent oracle ----------------------------------------------


def _oracle(url: str) -> dict[str, pl.DataFrame]:
    """The expected final tables from the whole source, with plain polars."""
    from pipeline_output.demo import computes, shop_data

    raw = shop_data.read_tables(url)
    customers = (
        computes.customers(raw["raw_customers"].lazy())
        .collect()
        .sort("updated_seq")
        .unique("customer_id", keep="last", maintain_order=True)
    )
    orders = computes.orders(raw["raw_orders"].lazy()).collect()
    events = computes.order_events(raw["raw_order_events"].lazy()).collect()
    return {"customers": customers, "orders": orders, "order_events": events}


DELTA_DATASETS = ("customers", "orders", "order_events")


def _tick_and_apply(defs: dg.Definitions, instance: dg.DagsterInstance) -> dict[str, list[str]]:
    planned = {}
    for name in DELTA_DATASETS:
        result = tick(defs, instance, name)
        keys = requested_keys(result, instance)
        planned[name] = keys
        for key in keys:
            assert run_window(defs, instance, name, key).success
    return planned


def test_demo_seed_tick_windows_match_the_polars_oracle(env, instance):
    from pipeline_output.demo import shop_data
    from pipeline_output.demo.code_location import demo_definitions

    shop_data.seed(env)
    defs = demo_definitions()
    first = _tick_and_apply(defs, instance)
    assert all(len(keys) == 1 and keys[0].startswith("..") for keys in first.values()), first

    shop_data.tick(env)
    second = _tick_and_apply(defs, instance)
    for name in DELTA_DATASETS:
        [key] = second[name]
        assert Window.from_key(key).low == Window.from_key(first[name][0]).high

    shop_data.tick(env)
    _tick_and_apply(defs, instance)

    expected = _oracle(env)
    runtime = get_runtime()
    for name in DELTA_DATASETS:
        got = runtime.iceberg.read(name)
        exp = expected[name]
        assert_same_multiset(got.select(exp.columns), exp.cast(got.select(exp.columns).schema))
        rows = runtime.windows.windows(name)
        assert [w.state for w in rows] == ["applied"] * 3, name
        assert len(snapshots(name)) >= 2
    # the customer dimension really did change (renames / re-segmentations moved rows)
    assert runtime.windows.windows("customers")[1].rows_read > 0


# --- a single-run backfill over many windows ------------------------------------------------------


@pytest.mark.slow
def test_single_run_backfill_of_200_windows_applies_them_in_order_one_snapshot_each(env, instance):
    import time

    n = 200
    make_source(env, list(range(1, n + 1)))
    defs = events_defs(max_rows=1)
    keys = requested_keys(tick(defs, instance, "ev_copy"), instance)
    assert len(keys) == n
    started = time.perf_counter()
    out = run_range(defs, instance, "ev_copy", keys)
    elapsed = time.perf_counter() - started
    print(f"\n200-window single-run backfill: {elapsed:.1f} s, {elapsed / n * 1000:.0f} ms/window")
    assert out.success
    ledger = get_runtime().windows.windows("ev_copy")
    assert len(ledger) == n
    assert [w.partition_key for w in ledger] == sorted(keys)
    assert all(w.state == "applied" and w.rows_read == 1 for w in ledger)
    applied_at = [w.applied_at for w in ledger]
    assert applied_at == sorted(applied_at), "windows were applied in window order"
    snaps = snapshots("ev_copy")
    assert len(snaps) == n, "one snapshot per window"
    assert [s.summary["pipeline-output.window-key"] for s in snaps] == sorted(keys)
    assert [s.snapshot_id for s in snaps] == [w.iceberg_snapshot_id for w in ledger]
    assert_same_multiset(table_rows("ev_copy"), source_frame(env))


def test_ledger_rejects_a_window_continuing_the_chain_out_of_seq_order(chain):
    # (20, 30] continues the chain after (10, 20] (seq 2) but claims seq 5
    with pytest.raises(psycopg.errors.ForeignKeyViolation) as info:
        _insert(chain, 5, 20, 30, 20)
    assert info.value.diag.constraint_name == "windows_chain_in_seq_order"


def test_ledger_rejects_bounds_that_are_not_canonical_keys(chain):
    # '5' sorts after '000...20' as text: a backwards window unless the format is enforced
    with (
        pytest.raises(psycopg.errors.CheckViolation) as info,
        psycopg.connect(chain, autocommit=True) as conn,
    ):
        conn.execute(_INSERT, ("d", 3, _key(20), "5", _key(20), f"{_key(20)}..5"))
    assert info.value.diag.constraint_name == "windows_key_format"
