"""The deploy log: one row per write to one arm (`DeployRecord`, table `deploys`), how a succeeded
write is recorded (`record_write`, the one definition both arms use), and the lookups the freshness
oracle, `status` and exactly-once repair (`find_marker`) make."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypedDict, Unpack, get_args

import psycopg
from psycopg import sql

from pipeline_output.contract.plan import WriteResult
from pipeline_output.contract.spec import ARMS, DatasetSpec
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER, WriteOptions, options_of
from pipeline_output.contract.windows import Window
from pipeline_output.errors import InvalidArgument
from pipeline_output.ledger.connection import RecordLog, column_list, columns_of, ledger_table

DeployStatus = Literal["succeeded", "failed", "diverged"]

DEPLOY_STATUSES: tuple[str, ...] = get_args(DeployStatus)


@dataclass(frozen=True)
class DeployRecord:
    """One write to one arm, as the ledger recorded it."""

    id: int
    dataset: str
    arm: str
    run_id: str | None
    strategy: str | None
    write_mode: str | None
    first_deploy: bool | None
    window: str | None
    window_key: str | None
    status: str
    rows_in: int | None
    rows_inserted: int | None
    rows_updated: int | None
    rows_deleted: int | None
    rows_unchanged: int | None
    rows_preserved: int | None
    rows_skipped: int | None
    rows_total_after: int | None
    snapshot_id: int | None
    started_at: datetime | None
    finished_at: datetime
    error: str | None
    attempt_marker: str | None = None  # the window attempt this write belongs to (migration 013)


DEPLOY_COLUMNS = columns_of(DeployRecord)


class DeployFields(TypedDict, total=False):
    """The columns of a deploy record a caller gives as they are (None where absent)."""

    run_id: str | None
    strategy: str | None
    write_mode: str | None  # default: the result's
    first_deploy: bool | None  # default: the result's
    window: Window | str | None  # recorded as text, and as its key when a `Window`
    snapshot_id: int | None
    started_at: datetime | None
    error: str | None
    attempt_marker: str | None  # the window attempt this write belongs to


DEPLOY_FIELDS: tuple[str, ...] = tuple(DeployFields.__annotations__)

DEPLOY_COUNTERS = [c for c in DEPLOY_COLUMNS if c.startswith("rows_")]


class DeployLog(RecordLog):
    """The `deploys` table's writes and reads (see the module docstring)."""

    def record_deploy(
        self,
        dataset: str,
        arm: str,
        *,
        status: str,
        result: WriteResult | None = None,
        counters: Mapping[str, int] | None = None,
        conn: psycopg.Connection[Any] | None = None,
        **fields: Unpack[DeployFields],
    ) -> DeployRecord:
        """Record one write to one arm. Counters come from `result` (or `counters`); `fields` are
        the record's other columns (`DeployFields`; the window as text and as its key)."""
        values = _deploy_values(dataset, arm, status, result, counters, fields)
        names = list(values)
        query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING {}").format(
            ledger_table("deploys"),
            column_list(names),
            sql.SQL(", ").join(sql.Placeholder() * len(names)),
            column_list(DEPLOY_COLUMNS),
        )
        with self.statement(conn) as c:
            row = c.execute(query, [values[n] for n in names]).fetchone()
        assert row is not None
        return DeployRecord(*row)

    def record_write(
        self,
        spec: DatasetSpec,
        result: WriteResult,
        *,
        started_at: datetime | None = None,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[WriteOptions],
    ) -> DeployRecord | None:
        """The one definition of a succeeded write's deploy record, for both arms.

        Nothing is recorded for a no-op re-deploy (nothing committed). The record carries the
        attempt marker from `summary` (window attempts), so `find_marker` is exact on both arms.
        The Iceberg arm's record is written after its commit (the publish pipeline); the legacy
        arm's inside its own transaction (`conn`), so its rows and its record commit together.
        """
        fields = _write_fields(spec, result, started_at, options)
        if fields is None:
            return None
        return self.record_deploy(
            spec.name, result.arm, status="succeeded", result=result, conn=conn, **fields
        )

    def record_writes(
        self,
        spec: DatasetSpec,
        results: Sequence[WriteResult],
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[WriteOptions],
    ) -> int:
        """`record_write` of each of `results` (a range run's partitions, one commit), as ONE
        statement — atomic by itself, one round trip to the control plane rather than one per
        partition; returns how many records it wrote."""
        rows = []
        for result in results:
            fields = _write_fields(spec, result, None, options)
            if fields is not None:
                rows.append(
                    _deploy_values(spec.name, result.arm, "succeeded", result, None, fields)
                )
        if not rows:
            return 0
        names = list(rows[0])
        one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(names)))
        query = sql.SQL("INSERT INTO {} ({}) VALUES {}").format(
            ledger_table("deploys"), column_list(names), sql.SQL(", ").join([one] * len(rows))
        )
        with self.statement(conn) as c:
            c.execute(query, [row[n] for row in rows for n in names])
        return len(rows)

    def find_marker(
        self, dataset: str, arm: str, marker: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> DeployRecord | None:
        """The succeeded deploy of `dataset` to `arm` that carries the attempt `marker`, if any."""
        where = {"dataset": dataset, "arm": arm, "attempt_marker": marker, "status": "succeeded"}
        return self._newest(where, conn=conn)

    def last_deploy(
        self,
        dataset: str,
        arm: str,
        *,
        status: str | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> DeployRecord | None:
        """The most recent deploy of `dataset` to `arm` (optionally only with `status`)."""
        where = {"dataset": dataset, "arm": arm}
        if status is not None:
            where["status"] = status
        return self._newest(where, conn=conn)

    def has_succeeded_deploy(
        self, dataset: str, arm: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> bool:
        """The legacy arm's freshness oracle: has `arm` ever committed a write of `dataset`?"""
        return self.last_deploy(dataset, arm, status="succeeded", conn=conn) is not None

    def deploys(
        self, dataset: str, *, arm: str | None = None, limit: int = 100
    ) -> list[DeployRecord]:
        """Recent deploys of `dataset` (newest first)."""
        where = {"dataset": dataset} if arm is None else {"dataset": dataset, "arm": arm}
        rows = self.select("deploys", DEPLOY_COLUMNS, where=where, newest_first=True, limit=limit)
        return [DeployRecord(*r) for r in rows]

    def _newest(
        self, where: dict[str, Any], *, conn: psycopg.Connection[Any] | None
    ) -> DeployRecord | None:
        """The newest deploy whose columns equal `where`'s values, if any."""
        rows = self.select(
            "deploys", DEPLOY_COLUMNS, where=where, newest_first=True, limit=1, conn=conn
        )
        return DeployRecord(*rows[0]) if rows else None


def _write_fields(
    spec: DatasetSpec, result: WriteResult, started_at: datetime | None, options: WriteOptions
) -> DeployFields | None:
    """A succeeded write's deploy record fields (`record_write`), or None when nothing is
    recorded: an Iceberg no-op (nothing committed), a legacy write that changed nothing."""
    window, run_id, summary = options_of(options)
    if result.arm == "iceberg" and result.noop:
        return None
    changed = result.rows_inserted or result.rows_updated or result.rows_deleted
    if result.arm == "pg" and not (changed or result.first_deploy):
        return None
    return DeployFields(
        run_id=run_id,
        strategy=spec.strategy,
        window=window,
        snapshot_id=result.snapshot_id if result.arm == "iceberg" else None,
        started_at=started_at,
        attempt_marker=(summary or {}).get(ATTEMPT_MARKER),
    )


def _deploy_values(
    dataset: str,
    arm: str,
    status: str,
    result: WriteResult | None,
    counters: Mapping[str, int] | None,
    fields: DeployFields,
) -> dict[str, Any]:
    """A deploy record's columns (`record_deploy`), checked: a known arm and status."""
    if arm not in ARMS:
        raise InvalidArgument(f"unknown arm {arm!r}; valid arms: {', '.join(ARMS)}")
    if status not in DEPLOY_STATUSES:
        raise InvalidArgument(
            f"unknown deploy status {status!r}; valid: {', '.join(DEPLOY_STATUSES)}"
        )
    values: dict[str, Any] = {c: None for c in DEPLOY_COUNTERS}
    values.update({name: fields.get(name) for name in DEPLOY_FIELDS})
    if result is not None:
        values.update({c: getattr(result, c) for c in DEPLOY_COUNTERS})
        values["write_mode"] = values["write_mode"] or result.write_mode
        if values["first_deploy"] is None:
            values["first_deploy"] = result.first_deploy
    if counters:
        values.update({c: counters[c] for c in DEPLOY_COUNTERS if c in counters})
    window = fields.get("window")
    values.update(
        dataset=dataset,
        arm=arm,
        status=status,
        window=str(window) if window is not None else None,
        window_key=window.to_key() if isinstance(window, Window) else None,
    )
    return values
