"""The truth per window: what each window partition of a run records as its materialisation.

A run that applies several windows (a range run) materialises one partition per window. Dagster
merges the step's metadata (every partition) under each partition's own (`add_asset_metadata(...,
partition_key=...)`), so the run-wide part holds only what is true of every window — the mode,
the arms, how many windows were applied or skipped, the table after the run — and each window's
figures (rows in / inserted / updated / deleted, `dagster/partition_row_count`, its snapshot or
deploy id, the write mode) go to its own partition. A window the run skipped (already applied)
says so, with the run and snapshot that applied it, never another window's figures.

Keys each window records (besides the write's own metadata, `metadata.publish_metadata`):
`window` (`(low, high]`), `window_action` (`applied`, `staged`, `skipped`, `repaired`) and
`dagster/partition_row_count` (the rows the window holds: the rows it read from the source).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.dagster_layer.metadata import table_metadata, write_metadata
from pipeline_output.services.publish import PublishResult, ResolvedMode
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.window_apply import WindowOutcome

WINDOW_KEY = "window"
ACTION_KEY = "window_action"
PARTITION_ROWS = "dagster/partition_row_count"


def run_metadata(outcomes: Sequence[WindowOutcome], mode: ResolvedMode) -> dict[str, Any]:
    """What is true of every window of the run (the step's output metadata)."""
    counts = {
        action: sum(o.action == action for o in outcomes)
        for action in ("applied", "staged", "skipped", "repaired")
    }
    meta: dict[str, Any] = {
        "mode": f"{mode.mode} (from {mode.source})",
        "arms": ", ".join(mode.arms),
        "run_windows": describe_windows(outcomes),
        "windows": ", ".join(f"{o.window} {o.action}" for o in outcomes),
        **{f"windows_{action}": n for action, n in counts.items() if n or action != "staged"},
    }
    return meta


def run_table_metadata(
    last: PublishResult, *, runtime: Runtime, spec: DatasetSpec
) -> dict[str, Any]:
    """The table after the run (its last write): total rows, name, link, column schema, files."""
    return {
        "dagster/row_count": last.primary.rows_total_after,
        "table": last.primary.table,
        **table_metadata(runtime, spec, arms=tuple(last.results)),
    }


def describe_windows(outcomes: Sequence[WindowOutcome]) -> str:
    """`4 windows (-inf, 2026-11-01T06:40:00+00:00]: 3 applied, 1 skipped` — the run's span and
    what happened, short enough for a summary line."""
    if not outcomes:
        return "no window"
    first, last = outcomes[0].window, outcomes[-1].window
    span = first if len(outcomes) == 1 else Window(low=first.low, high=last.high)
    actions: dict[str, int] = {}
    for outcome in outcomes:
        actions[outcome.action] = actions.get(outcome.action, 0) + 1
    what = ", ".join(f"{n} {action}" for action, n in actions.items())
    noun = "window" if len(outcomes) == 1 else "windows"
    return f"{len(outcomes)} {noun} {span}: {what}"


def window_metadata(outcome: WindowOutcome) -> dict[str, Any]:
    """One window's own metadata (it overrides the run-wide keys on its partition)."""
    meta: dict[str, Any] = {WINDOW_KEY: str(outcome.window), ACTION_KEY: outcome.action}
    row = outcome.row
    if outcome.result is not None:  # applied, or staged on the run's audit branch
        meta.update(write_metadata(outcome.result))  # the table itself is run-wide
        meta[PARTITION_ROWS] = outcome.result.primary.rows_in
        return meta
    where = row.iceberg_snapshot_id or row.pg_deploy_id
    by = (row.run_id or "?")[:8]
    if outcome.action == "skipped":
        meta["note"] = (
            f"no-op: skipped, already applied by run {by} (snapshot/deploy {where}); "
            "nothing written"
        )
    else:  # repaired: a crashed attempt had committed; the ledger was completed
        meta["note"] = (
            f"repaired: the attempt of run {by} had committed (snapshot/deploy {where}); "
            "ledger completed, nothing written"
        )
    meta["applied_by_run"] = row.run_id or ""
    meta["applied_snapshot_id"] = str(where) if where is not None else ""
    if row.rows_read is not None:
        meta[PARTITION_ROWS] = row.rows_read
    return meta


def record_window_metadata(
    context: dg.OutputContext,
    outcomes: Sequence[WindowOutcome],
) -> None:
    """Attach each window's metadata to its own partition of the step's materialisation."""
    try:
        step = context.step_context
    except dg.DagsterInvariantViolationError:  # a context built outside a run (a unit test)
        return
    targeted = set(context.asset_partition_keys) if context.has_asset_partitions else set()
    for outcome in outcomes:
        key = outcome.row.partition_key
        if key not in targeted:  # a window applied through another key spelling: run-wide only
            continue
        step.add_asset_metadata(
            window_metadata(outcome),
            asset_key=context.asset_key,
            partition_key=key,
        )
