"""The audit log of write-audit-publish: audited runs and the writes they staged (`AuditRecord`,
`AuditWrite`; tables `audits`, `audit_writes`, migration 020). `services/audit.py` decides, this
module only records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

from psycopg import sql
from psycopg.types.json import Jsonb

from pipeline_output.errors import InvalidArgument
from pipeline_output.ledger.connection import RecordLog, column_list, ledger_table

AuditState = Literal["staged", "published", "failed", "dropped"]
AUDIT_STATES: tuple[str, ...] = get_args(AuditState)


@dataclass(frozen=True)
class AuditRecord:
    """One audited run of one dataset."""

    id: int
    dataset: str
    run_id: str
    branch: str
    mode: str
    state: AuditState
    base_snapshot_id: int | None  # main's snapshot the branch started from
    snapshot_id: int | None  # the branch head: what a publish makes main
    gating_checks: list[str]
    reason: str | None
    staged_at: datetime
    decided_at: datetime | None


@dataclass(frozen=True)
class AuditWrite:
    """One write an audit staged (in order)."""

    seq: int
    snapshot_id: int | None  # None: the write changed nothing
    strategy: str  # the strategy it was written with (a restatement: replace)
    window_key: str | None = None  # the window it was written for (its write window)
    marker: str | None = None  # the window attempt, or the audit item's own marker
    result: dict[str, Any] = field(default_factory=dict)
    frame: bytes | None = None  # dual: the checked frame (Arrow IPC), replayed on the legacy arm


_AUDIT_COLUMNS = [
    "id",
    "dataset",
    "run_id",
    "branch",
    "mode",
    "state",
    "base_snapshot_id",
    "snapshot_id",
    "gating_checks",
    "reason",
    "staged_at",
    "decided_at",
]
_WRITE_COLUMNS = ["seq", "snapshot_id", "strategy", "window_key", "marker"]


def _audit(row: Sequence[Any]) -> AuditRecord:
    values = dict(zip(_AUDIT_COLUMNS, row, strict=True))
    values["gating_checks"] = list(values["gating_checks"] or [])
    return AuditRecord(**values)


class AuditLog(RecordLog):
    """Audited runs and their staged writes (see the module docstring)."""

    def stage_write(
        self,
        dataset: str,
        *,
        run_id: str,
        branch: str,
        mode: str,
        base_snapshot_id: int | None,
        write: AuditWrite,
    ) -> AuditRecord:
        """Record one staged write of `run_id`'s audit of `dataset` (the audit row is created by
        its first write; the branch head moves to the write's snapshot when it made one, and the
        base — main's snapshot the branch started from — is the parent of the first one)."""
        with self.tx(None) as conn:
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {t} (dataset, run_id, branch, mode, base_snapshot_id, "
                    "snapshot_id) VALUES (%s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (dataset, run_id) DO UPDATE SET "
                    "snapshot_id = coalesce(EXCLUDED.snapshot_id, {t}.snapshot_id), "
                    "base_snapshot_id = CASE WHEN {t}.snapshot_id IS NULL "
                    "THEN EXCLUDED.base_snapshot_id ELSE {t}.base_snapshot_id END "
                    "RETURNING {cols}"
                ).format(t=ledger_table("audits"), cols=column_list(_AUDIT_COLUMNS)),
                (dataset, run_id, branch, mode, base_snapshot_id, write.snapshot_id),
            ).fetchone()
            assert row is not None
            record = _audit(row)
            if record.state != "staged":
                raise InvalidArgument(
                    f"dataset {dataset!r}: the audit of run {run_id} is already {record.state}; "
                    "a decided audit takes no more writes"
                )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (audit_id, seq, snapshot_id, strategy, window_key, "
                    "marker, result, frame) SELECT %s, coalesce(max(seq), 0) + 1, "
                    "%s, %s, %s, %s, %s, %s FROM {} WHERE audit_id = %s"
                ).format(ledger_table("audit_writes"), ledger_table("audit_writes")),
                (
                    record.id,
                    write.snapshot_id,
                    write.strategy,
                    write.window_key,
                    write.marker,
                    Jsonb(write.result),
                    write.frame,
                    record.id,
                ),
            )
        return record

    def set_gating_checks(self, audit_id: int, checks: Sequence[str]) -> None:
        """The blocking checks that must pass before the audit publishes."""
        with self.tx(None) as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET gating_checks = %s WHERE id = %s").format(
                    ledger_table("audits")
                ),
                (sorted(set(checks)), audit_id),
            )

    def audit(self, dataset: str, run_id: str) -> AuditRecord | None:
        """The audit of `run_id`'s writes to `dataset`, if that run staged any."""
        rows = self.select("audits", _AUDIT_COLUMNS, where={"dataset": dataset, "run_id": run_id})
        return _audit(rows[0]) if rows else None

    def audits(
        self, dataset: str | None = None, *, states: Sequence[str] | None = None
    ) -> list[AuditRecord]:
        """Audits, newest first (optionally of one dataset, only in some states)."""
        where: list[sql.Composable] = []
        params: list[Any] = []
        if dataset is not None:
            where.append(sql.SQL("dataset = %s"))
            params.append(dataset)
        if states is not None:
            where.append(sql.SQL("state = ANY(%s)"))
            params.append(list(states))
        clause = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL("")
        with self.tx(None) as conn:
            rows = conn.execute(
                sql.SQL("SELECT {} FROM {}{} ORDER BY id DESC").format(
                    column_list(_AUDIT_COLUMNS), ledger_table("audits"), clause
                ),
                params,
            ).fetchall()
        return [_audit(r) for r in rows]

    def audits_of_run(self, run_id: str) -> list[AuditRecord]:
        """Every audit a run staged (one per dataset)."""
        return [_audit(r) for r in self.select("audits", _AUDIT_COLUMNS, where={"run_id": run_id})]

    def audit_writes(self, audit_id: int, *, frames: bool = False) -> list[AuditWrite]:
        """The writes an audit staged, in order (with the dual frames when `frames`)."""
        names = [*_WRITE_COLUMNS, "result", *(["frame"] if frames else [])]
        rows = self.select("audit_writes", names, where={"audit_id": audit_id}, order="seq")
        out = []
        for row in rows:
            values = dict(zip(names, row, strict=True))
            if values.get("frame") is not None:
                values["frame"] = bytes(values["frame"])
            out.append(AuditWrite(**values))
        return out

    def decide_audit(
        self,
        audit_id: int,
        state: AuditState,
        *,
        reason: str | None = None,
        from_states: Sequence[str] = ("staged",),
    ) -> bool:
        """Move an audit to `state` (only from `from_states`); False when it was not in one.
        Frames are no longer needed once decided and are dropped."""
        if state not in AUDIT_STATES:
            raise InvalidArgument(f"unknown audit state {state!r}; valid: {AUDIT_STATES}")
        with self.tx(None) as conn:
            row = conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = %s, reason = coalesce(%s, reason), "
                    "decided_at = clock_timestamp() WHERE id = %s AND state = ANY(%s) "
                    "RETURNING id"
                ).format(ledger_table("audits")),
                (state, reason[:2000] if reason else None, audit_id, list(from_states)),
            ).fetchone()
            if row is not None:
                conn.execute(
                    sql.SQL("UPDATE {} SET frame = NULL WHERE audit_id = %s").format(
                        ledger_table("audit_writes")
                    ),
                    (audit_id,),
                )
        return row is not None
