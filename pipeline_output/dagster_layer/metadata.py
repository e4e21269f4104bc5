"""Materialisation metadata: a publish result as Dagster metadata (what the UI shows).

Keys, grouped so that related ones sit together and numbers stay numbers (plottable across runs):

- Dagster's standard keys (`table_metadata.py`): `dagster/row_count` (rows in the table after the
  write), `dagster/partition_row_count` (a window run: rows the window wrote), `dagster/table_name`
  (`<catalog>.<namespace>.<table>`), `dagster/uri` (the table's location) and
  `dagster/column_schema` (Iceberg type names, the primary key as constraints, descriptions);
- what this write did, whatever the arm: `mode` (and where it came from), `arms`, `write_mode`,
  `why`, `noop`, `note`, the row counts `rows_in`, `rows_inserted`, `rows_updated`,
  `rows_deleted`, `rows_unchanged`, `rows_preserved`, `rows_skipped`, and the timings
  `duration_s`, `lock_wait_s`, `lock_held_s` (window runs add `windows`, `windows_applied`, …);
- `iceberg/…` the native table: `snapshot_id` (none on a no-op), `files_rewritten`, `files_added`, `data_files`,
  `delete_files`, `snapshots`, `last_maintenance`, `rows_total_after`, `audit_branch`;
- `pg/…` the legacy arm: `deploy_id`, `rows_total_after`, `uri` (`dual` only);
- a `dual` write also puts each arm's `write_mode`, `rows_in`, `rows_inserted`, `rows_updated`,
  `rows_deleted` under its prefix (the unprefixed figures are the primary arm's).

The dataset's spec is not among them (it rides on the asset's compute: `dataset_specs.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl
from pyiceberg.table import Table

from pipeline_output.contract.plan import WriteResult
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.table_metadata import (
    frame_column_schema,
    iceberg_table_metadata,
    legacy_table_metadata,
)
from pipeline_output.services.publish import PublishResult
from pipeline_output.services.runtime import Runtime
from pipeline_output.stores.iceberg.maintenance.health import file_counts


def _why(result: PublishResult) -> str:
    if result.primary.first_deploy:
        return "first deploy"
    if result.window is not None:
        return f"window {result.window}"
    return "re-deploy"


def publish_metadata(
    result: PublishResult,
    *,
    runtime: Runtime,
    spec: DatasetSpec,
    schema: pl.Schema | None = None,
) -> dict[str, Any]:
    """Everything a user looks for after a write: what the write did and why, each arm's own
    figures under its prefix (`write_metadata`), and Dagster's table keys (`table_metadata`)."""
    return {
        **write_metadata(result),
        **table_metadata(runtime, spec, arms=tuple(result.results), schema=schema),
    }


def write_metadata(result: PublishResult) -> dict[str, Any]:
    """What one write did and why, with each arm's figures under its prefix; reads nothing."""
    primary = result.primary
    plan = result.plans.get("iceberg") or next(iter(result.plans.values()), None)
    meta: dict[str, Any] = {
        "dagster/row_count": primary.rows_total_after,
        "mode": f"{result.mode.mode} (from {result.mode.source})",
        "arms": ", ".join(result.results),
        "write_mode": primary.write_mode,
        "why": plan.reason if plan is not None else _why(result),
        "noop": primary.noop,
        "rows_in": primary.rows_in,
        "rows_inserted": primary.rows_inserted,
        "rows_updated": primary.rows_updated,
        "rows_deleted": primary.rows_deleted,
        "rows_unchanged": primary.rows_unchanged,
        "rows_preserved": primary.rows_preserved,
        "rows_skipped": primary.rows_skipped,
        "duration_s": round(primary.duration_s, 4),
        "lock_wait_s": round(primary.lock_wait_s, 4),
        "lock_held_s": round(primary.lock_held_s, 4),
    }
    if primary.noop:
        meta["note"] = "no-op: nothing changed, no snapshot committed"
    if result.audit is not None:
        audit = result.audit
        meta["audit"] = (
            f"staged on branch {audit.branch}; main moves when the blocking checks pass"
            + (" (the legacy arm is written then)" if audit.mode == "dual" else "")
        )
        meta["arms"] = "iceberg, pg" if audit.mode == "dual" else "iceberg"
    both = len(result.results) > 1
    for arm, res in result.results.items():
        meta.update(_arm_metadata(arm, res, both=both))
    if result.audit is not None:
        meta["iceberg/audit_branch"] = result.audit.branch
    return meta


def table_metadata(
    runtime: Runtime,
    spec: DatasetSpec,
    *,
    arms: Sequence[str],
    schema: pl.Schema | None = None,
) -> dict[str, Any]:
    """The dataset's table as it is now, written to `arms`: Dagster's table keys (name, link,
    column schema) and the Iceberg table's file counts (one table load). `schema`: the written
    frame's, the legacy arm's column schema."""
    table = runtime.iceberg.load(spec) if "iceberg" in arms else None
    meta: dict[str, Any] = {}
    if table is not None:
        meta.update(iceberg_table_metadata(runtime, spec, table))
        meta.update(table_files_metadata(table))
    else:
        meta.update(legacy_table_metadata(runtime, spec))
        if schema is not None:
            meta["dagster/column_schema"] = frame_column_schema(spec, schema)
    if len(arms) > 1:
        meta["pg/uri"] = legacy_table_metadata(runtime, spec)["dagster/uri"]
    return meta


def _arm_metadata(arm: str, res: WriteResult, *, both: bool) -> dict[str, Any]:
    """One arm's figures under its prefix (its write mode and row counts only when two arms were
    written)."""
    if arm == "iceberg":
        meta: dict[str, Any] = {
            "iceberg/rows_total_after": res.rows_total_after,
            "iceberg/files_rewritten": res.files_rewritten,
            "iceberg/files_added": res.files_added,
        }
        if res.snapshot_id is not None:  # none on a no-op
            meta["iceberg/snapshot_id"] = str(res.snapshot_id)
    else:
        meta = {"pg/rows_total_after": res.rows_total_after}
        if res.snapshot_id is not None:
            meta["pg/deploy_id"] = str(res.snapshot_id)
    if both:  # each arm's own figures (the unprefixed ones are the primary arm's)
        meta[f"{arm}/write_mode"] = res.write_mode
        for count in ("rows_in", "rows_inserted", "rows_updated", "rows_deleted"):
            meta[f"{arm}/{count}"] = getattr(res, count)
    return meta


def table_files_metadata(table: Table | None) -> dict[str, Any]:
    """The Iceberg table's file counts and last maintenance (snapshot summary and table
    properties only: no manifest is read)."""
    if table is None:
        return {}
    counts = file_counts(table)
    return {
        "iceberg/data_files": counts.data_files,
        "iceberg/delete_files": counts.delete_files,
        "iceberg/snapshots": counts.snapshots,
        "iceberg/last_maintenance": counts.last_maintenance or "never",
    }
