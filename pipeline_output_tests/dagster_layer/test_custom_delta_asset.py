"""A delta dataset written by an asset of the user's own (not `@dataset`) returning a plain frame
for its window partitions: every window still goes through the exactly-once apply (ledger entry,
attempt marker, a retry applies nothing twice), and a write that cannot be a window is refused
before any I/O (issue 30, item 7).

It used to take a second path in `DatasetIOManager.handle_output` that published window by window
with no ledger entry and no attempt marker: re-running a window of an `append_always` dataset
appended its rows twice.
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest

from pipeline_output import DatasetSpec, Delta, Window, build_definitions
from pipeline_output.contract.spec import spec_to_dict
from pipeline_output.dagster_layer.keys import IO_MANAGER_KEY, SPEC_METADATA_KEY
from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime
from pipeline_output_tests.dagster_runs import failure_errors
from pipeline_output_tests.oracle import assert_same_multiset

NAME = "ev_custom"
PARTITIONS = f"{NAME}__windows"
MARKER = "pipeline-output.window-attempt"
SPEC = DatasetSpec(
    name=NAME,
    strategy="append_always",
    mode="iceberg",
    delta=Delta(source="ev", watermark="seq"),
)
W1, W2 = Window(low=None, high=5), Window(low=5, high=10)


@pytest.fixture
def env(runtime_env: Any, pg_db_url: str) -> Any:
    with psycopg.connect(pg_db_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ev (id bigint PRIMARY KEY, v text NOT NULL, seq bigint)")
        cur.executemany(
            "INSERT INTO ev VALUES (%s, %s, %s)", [(i, f"v{i}", i) for i in range(1, 11)]
        )
    yield pg_db_url
    reset_runtime()


def source_rows(url: str, window: Window | None) -> pl.DataFrame:
    """What the user's asset computes: the source rows of `window` (plain psycopg and polars)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, v, seq FROM ev ORDER BY id").fetchall()
    frame = pl.DataFrame(
        rows, schema={"id": pl.Int64, "v": pl.String, "seq": pl.Int64}, orient="row"
    )
    if window is None:
        return frame
    low = window.low if window.low is not None else -1
    return frame.filter((pl.col("seq") > low) & (pl.col("seq") <= window.high))


def user_defs(url: str, *, partitioned: bool = True) -> dg.Definitions:
    """The user's own asset for the delta dataset: returns a plain polars frame."""
    partitions = dg.DynamicPartitionsDefinition(name=PARTITIONS) if partitioned else None

    @dg.asset(
        name=NAME,
        partitions_def=partitions,
        io_manager_key=IO_MANAGER_KEY,
        metadata={SPEC_METADATA_KEY: json.dumps(spec_to_dict(SPEC))},
    )
    def ev_custom(context) -> pl.DataFrame:  # unannotated: Dagster refuses a string annotation
        if not context.has_partition_key_range and not context.has_partition_key:
            return source_rows(url, None)
        keys = context.partition_key_range
        window = Window(low=Window.from_key(keys.start).low, high=Window.from_key(keys.end).high)
        return source_rows(url, window)

    return build_definitions(datasets=[], assets=[ev_custom], with_maintenance=False)


def run(
    defs: dg.Definitions, instance: dg.DagsterInstance, *windows: Window, raise_on_error=True
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_implicit_global_asset_job_def()
    tags = (
        {
            "dagster/asset_partition_range_start": windows[0].to_key(),
            "dagster/asset_partition_range_end": windows[-1].to_key(),
        }
        if windows
        else None
    )
    return job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey(NAME)],
        tags=tags,
        raise_on_error=raise_on_error,
    )


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    return "\n".join(
        e.event_specific_data.error.to_string()  # type: ignore[union-attr]
        for e in result.get_step_failure_events()
    )


def table_rows() -> pl.DataFrame:
    return get_runtime().iceberg.read(NAME).select("id", "v", "seq")


def test_a_plain_frame_for_a_delta_window_is_applied_once_through_the_window_ledger(env, instance):
    defs = user_defs(env)
    ledger = get_runtime().windows
    ledger.plan(NAME, [W1, W2])
    instance.add_dynamic_partitions(PARTITIONS, [W1.to_key(), W2.to_key()])

    assert run(defs, instance, W1).success
    row = ledger.get(NAME, W1.to_key())
    assert row is not None and row.state == "applied", "the ledger records the window"
    table = get_runtime().iceberg.load(NAME)
    snapshot = table.current_snapshot()
    assert row.iceberg_snapshot_id == snapshot.snapshot_id
    assert snapshot.summary[MARKER] == row.marker, "the write carries the attempt marker"
    assert_same_multiset(table_rows(), source_rows(env, W1))

    # the retry of the same window: a no-op (append_always would otherwise append 5 rows again)
    assert run(defs, instance, W1).success
    assert len(get_runtime().iceberg.load(NAME).snapshots()) == 1
    assert_same_multiset(table_rows(), source_rows(env, W1))

    # a range run over both windows: its frame is split by window, W1 skipped, W2 applied once
    result = run(defs, instance, W1, W2)
    assert result.success
    meta = result.get_asset_materialization_events()[-1].materialization.metadata
    assert getattr(meta["windows_applied"], "value", None) == 1
    assert getattr(meta["windows_skipped"], "value", None) == 1
    assert [r.state for r in ledger.windows(NAME)] == ["applied", "applied"]
    assert len(get_runtime().iceberg.load(NAME).snapshots()) == 2
    assert_same_multiset(table_rows(), source_rows(env, None))


def test_a_plain_frame_for_a_delta_dataset_outside_any_window_is_refused_before_any_io(
    env, instance
):
    # no partition: a whole-table write would bypass the ledger
    result = run(user_defs(env, partitioned=False), instance, raise_on_error=False)
    assert not result.success
    text = failure_text(result)
    assert failure_errors(result) == ["UnsupportedWrite"], text
    assert f"dataset {NAME!r} is a delta dataset" in text, text
    assert get_runtime().iceberg.load(NAME) is None, "nothing was written"

    # a window the ledger never planned: refused, nothing written
    defs = user_defs(env)
    instance.add_dynamic_partitions(PARTITIONS, [W1.to_key()])
    result = run(defs, instance, W1, raise_on_error=False)
    assert not result.success
    assert "is not in the ledger" in failure_text(result)
    assert get_runtime().iceberg.load(NAME) is None, "nothing was written"
