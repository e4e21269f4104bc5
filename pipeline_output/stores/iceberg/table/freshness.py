"""The freshness oracle of the native arm: what the target's own history says (does the table
exist, has it a committed snapshot, how many rows does it hold) — DESIGN.md, "The freshness
oracle". Never decided by counting rows of another store."""

from __future__ import annotations

from pyiceberg.table import Table

from pipeline_output.contract.plan import TargetState


def state_of(table: Table | None) -> TargetState:
    """The freshness oracle on a loaded table: first deploy or re-deploy is decided by whether the
    table exists and has a committed snapshot on main — never by counting rows."""
    if table is None:
        return TargetState(exists=False, has_snapshot=False)
    snap = table.current_snapshot()
    return TargetState(
        exists=True,
        has_snapshot=snap is not None,
        snapshot_id=snap.snapshot_id if snap else None,
        total_rows=total_records(table),
    )


def total_records(table: Table) -> int:
    """The rows of main's current snapshot (its summary; position deletes subtracted)."""
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return 0
    summary = snap.summary
    # rows deleted by position are still counted in their data files' records
    return int(summary.get("total-records", "0") or 0) - int(
        summary.get("total-position-deletes", "0") or 0
    )
