"""The `pipeline-output.*` properties of a snapshot's summary: which dataset, strategy, write
mode, run and window (or Dagster partition) wrote it, and its row counts (`pipeline-output history` shows them; the
attempt marker of exactly-once repair is one of them)."""

from __future__ import annotations

from pipeline_output.contract.plan import RowCounts, WritePlan
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.version import VERSION
from pipeline_output.stores.iceberg.table.tables import PROPERTY_PREFIX


def summary_properties(
    spec: DatasetSpec, plan: WritePlan, run_id: str | None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The namespaced properties every snapshot of ours carries."""
    props = {
        f"{PROPERTY_PREFIX}dataset": spec.name,
        f"{PROPERTY_PREFIX}strategy": spec.strategy,
        f"{PROPERTY_PREFIX}write-mode": plan.write_mode,
        f"{PROPERTY_PREFIX}first-deploy": str(plan.first_deploy).lower(),
        f"{PROPERTY_PREFIX}run-id": run_id or "",
        f"{PROPERTY_PREFIX}version": VERSION,
    }
    if plan.window is not None:
        props[f"{PROPERTY_PREFIX}window"] = str(plan.window)
        props[f"{PROPERTY_PREFIX}window-key"] = plan.window.to_key()
    if plan.partition is not None:
        props[f"{PROPERTY_PREFIX}partition"] = plan.partition.key
    for key, value in (extra or {}).items():
        props[f"{PROPERTY_PREFIX}{key}"] = value
    return props


def row_properties(counts: RowCounts) -> dict[str, str]:
    """The row counters of a write, kept in its snapshot summary (`pipeline-output history`
    shows them: Iceberg's own added/deleted records count rewritten files' rows too)."""
    return {
        f"{PROPERTY_PREFIX}rows-inserted": str(counts.inserted),
        f"{PROPERTY_PREFIX}rows-updated": str(counts.updated),
        f"{PROPERTY_PREFIX}rows-deleted": str(counts.deleted),
    }
