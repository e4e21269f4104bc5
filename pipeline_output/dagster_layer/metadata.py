"""Materialisation metadata: a publish result as Dagster metadata (what the UI shows)."""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl
from pyiceberg.table import Table

from pipeline_output.services.publish import PublishResult
from pipeline_output.stores.iceberg.maintenance.health import file_counts


def column_schema(schema: pl.Schema) -> dg.TableSchema:
    """`dagster/column_schema` from a polars schema."""
    return dg.TableSchema(
        columns=[dg.TableColumn(name, str(dtype)) for name, dtype in schema.items()]
    )


def _why(result: PublishResult) -> str:
    if result.primary.first_deploy:
        return "first deploy"
    if result.window is not None:
        return f"window {result.window}"
    return "re-deploy"


def publish_metadata(result: PublishResult, *, schema: pl.Schema | None) -> dict[str, Any]:
    """Everything a user looks for after a write: mode and why, counts, snapshot, table, schema."""
    primary = result.primary
    plan = result.plans.get("iceberg") or next(iter(result.plans.values()), None)
    meta: dict[str, Any] = {
        "mode": f"{result.mode.mode} (from {result.mode.source})",
        "arms": ", ".join(result.results),
        "write_mode": primary.write_mode,
        "why": plan.reason if plan is not None else _why(result),
        "noop": primary.noop,
        "dagster/row_count": primary.rows_total_after,
        "rows_in": primary.rows_in,
        "rows_inserted": primary.rows_inserted,
        "rows_updated": primary.rows_updated,
        "rows_deleted": primary.rows_deleted,
        "rows_unchanged": primary.rows_unchanged,
        "rows_preserved": primary.rows_preserved,
        "rows_skipped": primary.rows_skipped,
        "files_rewritten": primary.files_rewritten,
        "duration_s": round(primary.duration_s, 4),
        "lock_wait_s": round(primary.lock_wait_s, 4),
        "lock_held_s": round(primary.lock_held_s, 4),
        "table": primary.table,
        "dagster/table_name": primary.table,
    }
    if primary.noop:
        meta["note"] = "no-op: nothing changed, no snapshot committed"
    if primary.snapshot_id is not None:
        meta["snapshot_id"] = str(primary.snapshot_id)
    for arm, res in result.results.items():
        if arm != "iceberg" or len(result.results) > 1:
            meta[f"{arm}/write_mode"] = res.write_mode
            for count in ("rows_in", "rows_inserted", "rows_updated", "rows_deleted"):
                meta[f"{arm}/{count}"] = getattr(res, count)  # each arm's own figures
            meta[f"{arm}/rows_total_after"] = res.rows_total_after
            meta[f"{arm}/deploy_or_snapshot_id"] = (
                str(res.snapshot_id) if res.snapshot_id else "no-op"
            )
    if result.audit is not None:
        audit = result.audit
        meta["audit"] = (
            f"staged on branch {audit.branch}; main moves when the blocking checks pass"
            + (" (the legacy arm is written then)" if audit.mode == "dual" else "")
        )
        meta["audit_branch"] = audit.branch
        meta["arms"] = "iceberg, pg" if audit.mode == "dual" else "iceberg"
    if schema is not None:
        meta["dagster/column_schema"] = column_schema(schema)
    return meta


def table_files_metadata(table: Table | None) -> dict[str, Any]:
    """The Iceberg table's file counts and last maintenance (snapshot summary and table
    properties only: no manifest is read)."""
    if table is None:
        return {}
    counts = file_counts(table)
    return {
        "data_files": counts.data_files,
        "delete_files": counts.delete_files,
        "snapshots": counts.snapshots,
        "last_maintenance": counts.last_maintenance or "never",
    }
