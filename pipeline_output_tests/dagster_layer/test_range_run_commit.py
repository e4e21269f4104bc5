"""A single-run backfill (a Dagster range run) of a `replace` dataset in iceberg mode is one
commit (issue 44): one snapshot for its N partitions, each partition's deploy record and
materialisation its own, the table equal to the computes' rows (plain polars), a re-run the same
result, and a failure anywhere in the range leaving the table — and its data directory — as it
was. Files straddling the run's slices (after a compaction) are rewritten without the slices'
rows.
"""

from __future__ import annotations

import threading
from datetime import date
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output import DatasetSpec, build_definitions, dataset
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.services.publish import ResolvedMode
from pipeline_output.stores.iceberg.snapshot import files
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
from pipeline_output.stores.iceberg.write import range_write
from pipeline_output.stores.iceberg.write.range_write import ENCODE_FRAMES
from pipeline_output_tests.dagster_runs import partition_meta
from pipeline_output_tests.oracle import assert_same_multiset

DAYS = ["2024-01-30", "2024-01-31", "2024-02-01", "2024-02-02"]  # across a month boundary
DAILY = dg.DailyPartitionsDefinition(start_date=DAYS[0], end_date="2024-02-03")
NAME = "ranged"


def day_rows(day: str, ids: list[int], *, version: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "day": pl.Series([date.fromisoformat(day)] * len(ids), dtype=pl.Date),
            "amount": pl.Series([i * 1.5 + version for i in ids], dtype=pl.Float64),
        }
    )


# the dataset every test here defines: a daily `replace` of `NAME` on the Iceberg arm
DAILY_REPLACE: dict[str, Any] = {
    "name": NAME,
    "primary_key": "id",
    "strategy": "replace",
    "mode": "iceberg",
    "partitions_def": DAILY,
    "partition_column": "day",
}


def defs_for(source: dict[str, Any]) -> dg.Definitions:
    """A daily `replace` dataset reading `source[partition_key]` (an exception: raised)."""

    @dataset(**DAILY_REPLACE)
    def ranged(partition_key: str) -> pl.DataFrame:
        value = source[partition_key]
        if isinstance(value, Exception):
            raise value
        return value  # type: ignore[no-any-return]

    return build_definitions(datasets=[ranged], with_maintenance=False)


def run(defs: dg.Definitions, instance: dg.DagsterInstance, *keys: str) -> bool:
    """One run of the range `keys[0]..keys[-1]`; whether it succeeded."""
    job = defs.resolve_implicit_global_asset_job_def()
    tags = {
        "dagster/asset_partition_range_start": keys[0],
        "dagster/asset_partition_range_end": keys[-1],
    }
    result = job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(NAME)], tags=tags, raise_on_error=False
    )
    return result.success


def table() -> pl.DataFrame:
    spec = DatasetSpec(name=NAME, primary_key=("id",))
    return get_runtime().publisher.read(spec, mode=ResolvedMode("iceberg", "run config"))


def snapshots() -> list[Any]:
    loaded = get_runtime().iceberg.load(NAME)
    assert loaded is not None
    return list(loaded.snapshots())


def data_files_on_disk() -> set[str]:
    loaded = get_runtime().iceberg.load(NAME)
    assert loaded is not None
    root = Path(loaded.metadata.location.removeprefix("file://")) / "data"
    return {str(p) for p in root.rglob("*.parquet")}


def test_a_replace_range_run_is_one_snapshot_and_a_rerun_gives_the_same_table(env, instance):
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)

    assert run(defs, instance, *DAYS)  # the table's first write: created with every partition
    assert len(snapshots()) == 1
    assert_same_multiset(table(), pl.concat(source.values()))
    first = {d: partition_meta(instance, NAME, d) for d in DAYS}
    assert {m["rows_inserted"] for m in first.values()} == {3}
    assert len({m["iceberg/snapshot_id"] for m in first.values()}) == 1  # one shared commit

    # days 2 and 3 change (a row fewer, other values); days 1 and 4 are computed the same
    source[DAYS[1]] = day_rows(DAYS[1], [10, 11], version=1)
    source[DAYS[2]] = day_rows(DAYS[2], [20, 21, 22, 23], version=2)
    assert run(defs, instance, *DAYS[1:3])
    assert len(snapshots()) == 2  # two partitions, one snapshot
    expected = pl.concat(source.values())
    assert_same_multiset(table(), expected)
    got = {d: partition_meta(instance, NAME, d) for d in DAYS[1:3]}
    assert {d: (m["rows_inserted"], m["rows_deleted"]) for d, m in got.items()} == {
        DAYS[1]: (2, 3),
        DAYS[2]: (4, 3),
    }
    assert all(m["why"] == f"partition {d}" for d, m in got.items())
    deploys = get_runtime().ledger.deploy_log.deploys(NAME, arm="iceberg")  # type: ignore[union-attr]
    assert len(deploys) == len(DAYS) + 2  # each partition of each run its own record
    files = data_files_on_disk()

    assert run(defs, instance, *DAYS)  # the same backfill again: the same table, one commit
    assert len(snapshots()) == 3
    assert_same_multiset(table(), expected)
    assert len(data_files_on_disk() - files) >= len(DAYS)  # each partition's files written anew


def test_a_failure_mid_range_commits_nothing_and_leaves_no_files(env, instance):
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)
    assert run(defs, instance, *DAYS)
    before, history, files = table(), len(snapshots()), data_files_on_disk()
    good = dict(source)

    source[DAYS[0]] = day_rows(DAYS[0], [0, 1], version=5)  # would change, but ...
    source[DAYS[2]] = RuntimeError("the compute of the third day fails")
    assert not run(defs, instance, *DAYS)
    source[DAYS[2]] = day_rows(DAYS[2], [1])  # ... a key of the first day's rows again
    assert not run(defs, instance, *DAYS)
    source[DAYS[2]] = day_rows(DAYS[2], [])  # ... an empty day would delete its 3 rows
    assert not run(defs, instance, *DAYS)

    assert len(snapshots()) == history
    assert_same_multiset(table(), before)
    assert_same_multiset(before, pl.concat(good.values()))
    assert data_files_on_disk() == files  # the files written for the failed runs are gone


def test_a_range_run_rewrites_a_compacted_file_straddling_its_slices(env, instance):
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)
    assert run(defs, instance, *DAYS[:2])
    assert run(defs, instance, *DAYS[2:])
    runtime = get_runtime()
    spec = DatasetSpec(name=NAME, primary_key=("id",), strategy="replace")
    assert not runtime.iceberg.compact(spec, min_input_files=2).noop  # files spanning days
    loaded = runtime.iceberg.load(NAME)
    assert loaded is not None and len(loaded.inspect.files()) < len(DAYS)

    source[DAYS[1]] = day_rows(DAYS[1], [11, 15], version=1)
    source[DAYS[2]] = day_rows(DAYS[2], [], version=1)
    assert run(defs, instance, *DAYS[1:3]) is False  # an empty day: refused (allow_empty)
    source[DAYS[2]] = day_rows(DAYS[2], [29], version=1)
    assert run(defs, instance, *DAYS[1:3])
    assert_same_multiset(table(), pl.concat(source.values()))


def test_a_partition_adding_a_column_ends_the_one_commit_there(env, instance):
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(2)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)
    assert run(defs, instance, *DAYS)
    history = len(snapshots())
    for day in DAYS[2:]:  # from the third day on the compute has a new column
        source[day] = source[day].with_columns(note=pl.lit("new"))
    assert run(defs, instance, *DAYS)
    # days 1-2 together, then day 3 (its evolution under the lock) and day 4 one by one
    assert len(snapshots()) == history + 3
    expected = pl.concat(source.values(), how="diagonal")
    assert_same_multiset(table(), expected)


def test_a_range_run_logs_its_partitions_in_one_line(env, instance):
    """Each log line is a Dagster event: a range run says what each partition did in one line,
    not one line (and one event) per partition — its one commit said once, and consecutive
    partitions that did the same as one stretch; the same line is the run's `partitions`."""
    rows_per_day = [1, 1, 1, 2]
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(k)])
        for n, (d, k) in enumerate(zip(DAYS, rows_per_day, strict=True))
    }
    job = defs_for(source).resolve_implicit_global_asset_job_def()
    tags = {
        "dagster/asset_partition_range_start": DAYS[0],
        "dagster/asset_partition_range_end": DAYS[-1],
    }
    result = job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(NAME)], tags=tags
    )
    said = [
        e.user_message
        for e in instance.all_logs(result.run_id)
        if e.dagster_event is None
        and e.user_message.startswith(f"{NAME}: ")
        and "+1 " in e.user_message
    ]
    last = result.asset_materializations_for_node(NAME)[-1].metadata
    snapshot = last["iceberg/snapshot_id"].value
    line = (
        f"{len(DAYS)} partitions, one commit {snapshot} (replace): "
        f"{DAYS[0]} .. {DAYS[2]} (3): +1 ~0 -0 each; {DAYS[3]}: +2 ~0 -0"
    )
    skipped = "parity skipped: not a dual write (arms: iceberg); nothing to compare"
    assert said == [f"{NAME}: {line}; {skipped}"], said
    assert last["partitions"].value == line


def test_a_range_run_encodes_a_partition_while_the_next_is_computed(env, instance, monkeypatch):
    """A partition's Parquet files are written on another thread while the next partition is
    computed (two cores: the encode is off the compute's path), with at most `ENCODE_FRAMES`
    partitions' frames held at once (waiting, encoding or being computed); partitions above
    `ENCODE_BYTES` are computed and written one at a time."""
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    started = {d: threading.Event() for d in DAYS}
    lock = threading.Lock()
    alive, peak, overlapped, waits = [0], [0], [], True

    def computing(key: str) -> None:
        started[key].set()
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])

    real = DataFileWriter.write

    def write(self: DataFileWriter, frame: pl.DataFrame, **options: Any) -> list[Any]:
        day = frame.get_column("day")[0].isoformat()
        following = DAYS[DAYS.index(day) + 1 :]
        if following and waits:  # this partition's encode waits for the next one's compute
            overlapped.append(started[following[0]].wait(timeout=10))
        try:
            return real(self, frame, **options)
        finally:
            with lock:
                alive[0] -= 1

    monkeypatch.setattr(DataFileWriter, "write", write)

    @dataset(**DAILY_REPLACE)
    def ranged(partition_key: str) -> pl.DataFrame:
        computing(partition_key)
        return source[partition_key]  # type: ignore[no-any-return]

    defs = build_definitions(datasets=[ranged], with_maintenance=False)
    assert run(defs, instance, *DAYS)
    assert overlapped == [True] * (len(DAYS) - 1)
    assert peak[0] <= ENCODE_FRAMES
    assert len(snapshots()) == 1
    assert_same_multiset(table(), pl.concat(source.values()))

    waits, peak[0] = False, 0
    monkeypatch.setattr(range_write, "ENCODE_BYTES", 1)  # every frame is "large"
    assert run(defs, instance, *DAYS)
    assert peak[0] == 1  # each partition computed once the one before was written
    assert len(snapshots()) == 2
    assert_same_multiset(table(), pl.concat(source.values()))


def test_a_range_run_computes_partitions_ahead_of_a_slow_encode_up_to_its_frame_bound(
    env, instance, monkeypatch
):
    """While a partition's encode is still running, the run computes the partitions after it —
    not one only: the first partition's encode here ends only once the last partition's compute
    started (every frame of the four held at once, within `ENCODE_FRAMES`). The bound holds:
    with `ENCODE_FRAMES` 3 the fourth partition is computed only after the first is written."""
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    started = {d: threading.Event() for d in DAYS}
    order: list[tuple[str, str]] = []
    waits_for = [DAYS[-1]]  # the partition whose compute the first partition's encode awaits
    ahead: list[bool] = []
    real = DataFileWriter.write

    def write(self: DataFileWriter, frame: pl.DataFrame, **options: Any) -> list[Any]:
        day = frame.get_column("day")[0].isoformat()
        if day == DAYS[0]:
            ahead.append(started[waits_for[0]].wait(timeout=10))
        try:
            return real(self, frame, **options)
        finally:
            order.append(("written", day))

    monkeypatch.setattr(DataFileWriter, "write", write)

    @dataset(**DAILY_REPLACE)
    def ranged(partition_key: str) -> pl.DataFrame:
        order.append(("computed", partition_key))
        started[partition_key].set()
        return source[partition_key]  # type: ignore[no-any-return]

    defs = build_definitions(datasets=[ranged], with_maintenance=False)
    assert len(DAYS) <= ENCODE_FRAMES
    assert run(defs, instance, *DAYS)
    assert ahead == [True]  # every partition computed while the first still encoded
    assert order.index(("computed", DAYS[-1])) < order.index(("written", DAYS[0]))
    assert len(snapshots()) == 1
    assert_same_multiset(table(), pl.concat(source.values()))

    for event in started.values():
        event.clear()
    order.clear()
    ahead.clear()
    waits_for[0] = DAYS[2]
    monkeypatch.setattr(range_write, "ENCODE_FRAMES", 3)
    assert run(defs, instance, *DAYS)
    assert ahead == [True]  # two partitions computed ahead of the first's encode ...
    # ... and the fourth only once the first was written: three frames held at most
    assert order.index(("written", DAYS[0])) < order.index(("computed", DAYS[3]))
    assert len(snapshots()) == 2
    assert_same_multiset(table(), pl.concat(source.values()))


def encodes_waiting_for(monkeypatch: Any, step: str) -> tuple[list[bool], threading.Event]:
    """Every data file's encode made to wait (10 s at most) until `range_write.<step>` has
    started: whether each waited for it, and the event it sets. A step that runs only after the
    encodes (not beside them) makes each wait time out (False)."""
    started = threading.Event()
    real_step, real_write = getattr(range_write, step), DataFileWriter.write
    overlapped: list[bool] = []

    def step_started(*args: Any, **kwargs: Any) -> Any:
        started.set()
        return real_step(*args, **kwargs)

    def write(self: DataFileWriter, frame: pl.DataFrame, **options: Any) -> list[Any]:
        overlapped.append(started.wait(timeout=10))
        return real_write(self, frame, **options)

    monkeypatch.setattr(range_write, step, step_started)
    monkeypatch.setattr(DataFileWriter, "write", write)
    return overlapped, started


def test_a_partition_run_reads_the_tables_manifests_while_its_partition_encodes(
    env, instance, monkeypatch
):
    """The writer lock, the table load and its manifests are taken while the run's last
    partition is still encoding, not after: a one-partition run's bookkeeping overlaps its
    Parquet encode. The result is the same table."""
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)
    assert run(defs, instance, *DAYS)
    overlapped, _ = encodes_waiting_for(monkeypatch, "read_index")  # the manifests' read
    source[DAYS[2]] = day_rows(DAYS[2], [20, 27], version=3)
    assert run(defs, instance, DAYS[2])
    assert overlapped == [True]
    assert len(snapshots()) == 2
    assert_same_multiset(table(), pl.concat(source.values()))


def test_a_partition_run_plans_its_commit_while_its_partition_encodes(env, instance, monkeypatch):
    """The commit's plan — the files each slice replaces found, the rows each partition
    deletes counted — is made while the run's last partition is still encoding, not after it:
    the encode waits for the plan (it would time out were the plan made after the files).
    Re-running the partition gives the same table (the oracle: plain polars over the inputs)."""
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)
    assert run(defs, instance, *DAYS)
    overlapped, planned = encodes_waiting_for(monkeypatch, "_replace_slices")  # the plan
    source[DAYS[1]] = day_rows(DAYS[1], [10, 17, 18], version=2)
    for attempt in (1, 2):  # a re-run replaces the same slice with the same rows
        planned.clear()
        assert run(defs, instance, DAYS[1])
        assert overlapped == [True] * attempt
        assert len(snapshots()) == 1 + attempt
        assert_same_multiset(table(), pl.concat(source.values()))
        meta = partition_meta(instance, NAME, DAYS[1])
        assert meta["rows_deleted"] == 3, sorted(meta)


def test_a_partition_run_sets_up_file_statistics_once_for_the_one_writer_that_writes(
    env, instance, monkeypatch
):
    """The statistics set-up of a table's schema is made by a writer when it first writes a
    file, not when it is made: a partition run's commit makes writers for files it does not
    write (its data files are written already, it deletes no positions) and sets up nothing for
    them. A table of top-level primitive columns is planned from its fields, never by
    pyiceberg's schema visitors (~1 ms in a fresh process). Same table, run twice."""
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)
    assert run(defs, instance, *DAYS)
    plans: list[str] = []
    visited: list[str] = []
    real = files.flat_statistics_plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        plans.append(threading.current_thread().name)
        return real(*args, **kwargs)

    def visit(*_: Any, **__: Any) -> Any:
        visited.append(threading.current_thread().name)
        raise AssertionError("pyiceberg's statistics visitor")

    monkeypatch.setattr(files, "flat_statistics_plan", counted)
    monkeypatch.setattr(files, "compute_statistics_plan", visit)
    monkeypatch.setattr(files, "parquet_path_to_id_mapping", visit)
    for version in (3, 4):
        plans.clear()
        source[DAYS[1]] = day_rows(DAYS[1], [10, 17], version=version)
        assert run(defs, instance, DAYS[1])
        assert len(plans) == 1 and not visited, (plans, visited)
        assert_same_multiset(table(), pl.concat(source.values()))


def test_a_partition_of_the_tables_own_columns_is_written_without_schema_planning(
    env, instance, monkeypatch
):
    """A partition whose frame has exactly the table's columns and polars types (all of types
    that read back as themselves) plans no schema evolution: no Arrow or Iceberg conversion of
    the frame's schema (~0.6 ms of a fresh process's one-partition write, issue 44). A
    partition with a new column is still planned, and evolves the table."""
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)]) for n, d in enumerate(DAYS)
    }
    defs = defs_for(source)
    assert run(defs, instance, *DAYS)
    planned: list[list[str]] = []
    real_plan = range_write.plan_evolution

    def plan(spec: Any, schema: Any, frame: pl.DataFrame) -> Any:
        planned.append(frame.columns)
        return real_plan(spec, schema, frame)

    monkeypatch.setattr(range_write, "plan_evolution", plan)
    source[DAYS[2]] = day_rows(DAYS[2], [20, 27], version=3)
    assert run(defs, instance, DAYS[2])
    assert planned == []
    assert_same_multiset(table(), pl.concat(source.values()))
    source[DAYS[3]] = day_rows(DAYS[3], [30], version=4).with_columns(note=pl.lit("new"))
    assert run(defs, instance, DAYS[3])
    assert planned[0] == ["id", "day", "amount", "note"]
    assert "note" in table().columns


def test_a_range_runs_encode_thread_only_encodes_and_its_files_count_their_nans(
    env, instance, monkeypatch
):
    """A partition's frame is put in the table's columns and order, and its keys and NaN values
    counted, on the run's own thread before it is handed to an encode thread: that thread's
    Python (which waits for the GIL the computing thread holds) is the encode's call and the
    file's put. A frame in the table's columns, order and types already is taken as it is (no
    polars query on the computing thread); here every other partition's columns come in
    another order. Each data file still records its own NaN count."""
    source: dict[str, Any] = {
        d: day_rows(d, [n * 10 + i for i in range(3)])
        .with_columns(amount=pl.Series([float("nan")] * n + [1.0] * (3 - n), dtype=pl.Float64))
        .select(["id", "day", "amount"] if n % 2 == 0 else ["amount", "day", "id"])
        for n, d in enumerate(DAYS)
    }
    aligned_on: list[str] = []
    real_align = range_write.align_to_schema

    def align(frame: pl.DataFrame, *args: Any, **kwargs: Any) -> pl.DataFrame:
        aligned_on.append(threading.current_thread().name)
        return real_align(frame, *args, **kwargs)

    monkeypatch.setattr(range_write, "align_to_schema", align)
    caller = threading.current_thread().name
    assert run(defs_for(source), instance, *DAYS)
    assert aligned_on == [caller] * (len(DAYS) // 2)  # the reordered partitions only
    loaded = get_runtime().iceberg.load(NAME)
    assert loaded is not None
    amount = loaded.schema().find_field("amount").field_id
    nans = sorted(t.file.nan_value_counts[amount] for t in loaded.scan().plan_files())
    assert nans == [0, 1, 2, 3]
    assert_same_multiset(table(), pl.concat(source.values(), how="diagonal"))
