"""Time travel and rollback of a dataset's native table.

- `parse_as_of` reads the `as_of` of an asset config or a command line: a snapshot id, or an
  ISO-8601 time with a zone (`Z` or an offset; a naive time names no instant and is refused).
  Reading a past version is `IcebergStore.read(as_of=...)` / `Publisher.scan(as_of=...)`; a
  time whose version snapshot expiry removed is refused (`SnapshotExpired`, `snapshot_log`).
- `history`: main's snapshots, newest first, with the `pipeline-output.*` summary of each (run,
  strategy, write mode, window, rows inserted/updated/deleted) — `pipeline-output history`.
- `rollback`: main back to an earlier snapshot of its history in one catalog commit, recorded in
  the ledger with who/when/why; windows applied after it go back to planned; refused where it
  would break the canary — `pipeline-output rollback`.

Pure core: no Dagster.
"""

from __future__ import annotations

import getpass
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import DatasetNotWritten, InvalidArgument, RollbackRefused
from pipeline_output.ledger.control_plane import RollbackRecord
from pipeline_output.stores.iceberg.table.snapshot_log import snapshot_at
from pipeline_output.stores.iceberg.table.tables import (
    PROPERTY_PREFIX,
    ancestry,
    head,
    main_since,
    move_main,
    summary_rows,
)

if TYPE_CHECKING:
    from pipeline_output.contract.windows import WindowLog
    from pipeline_output.services.publish import Publisher
    from pipeline_output.stores.iceberg import IcebergStore


def parse_as_of(
    text: str | int, *, dataset: str | None = None, what: str = "as_of"
) -> int | datetime:
    """A snapshot id (digits) or a timezone-aware time (ISO-8601 with `Z` or an offset);
    refusals name `dataset` when given."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    raw = str(text).strip()
    if raw.lstrip("-").isdigit():
        return int(raw)
    label = f"dataset {dataset!r}: {what}" if dataset else what
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise InvalidArgument(
            f"{label} {raw!r} is neither a snapshot id nor an ISO-8601 time "
            "(e.g. 2026-12-01T09:30:00Z)"
        ) from exc
    if moment.tzinfo is None:
        raise InvalidArgument(
            f"{label} {raw!r} has no time zone; add Z (UTC) or an offset such as +01:00"
        )
    return moment


@dataclass(frozen=True)
class HistoryRow:
    """One snapshot of main's history, with what pipeline-output recorded in its summary."""

    snapshot_id: int
    parent_id: int | None
    committed_at: datetime
    main_since: datetime | None  # when main last started pointing at it (a publish, a rollback)
    operation: str
    run_id: str | None
    strategy: str | None
    write_mode: str | None
    window: str | None
    inserted: int | None
    updated: int | None
    deleted: int | None
    total: int | None
    current: bool


def history(store: IcebergStore, spec: DatasetSpec | str) -> list[HistoryRow]:
    """Main's history of the dataset's table, newest first (snapshots an audit staged but never
    published, or a rollback took off main, are not in it: `audit show` lists the former)."""
    table = store.load(spec)
    if table is None:
        raise DatasetNotWritten(f"dataset {store.table_name(spec)!r} has no Iceberg table yet")
    main = head(table)
    since = main_since(table)
    return [
        _history_row(s, since.get(s.snapshot_id), s.snapshot_id == main)
        for s in ancestry(table, main)
    ]


def _history_row(snapshot: Any, since_ms: int | None, current: bool) -> HistoryRow:
    summary = snapshot.summary

    def get(key: str) -> str | None:
        value = summary.get(key) if summary is not None else None
        return str(value) if value not in (None, "") else None

    def count(key: str) -> int | None:
        value = get(key)
        return int(value) if value is not None else None

    return HistoryRow(
        snapshot_id=snapshot.snapshot_id,
        parent_id=snapshot.parent_snapshot_id,
        committed_at=_utc(snapshot.timestamp_ms),
        main_since=_utc(since_ms) if since_ms is not None else None,
        operation=str(summary.operation.value) if summary is not None else "",
        run_id=get(f"{PROPERTY_PREFIX}run-id"),
        strategy=get(f"{PROPERTY_PREFIX}strategy"),
        write_mode=get(f"{PROPERTY_PREFIX}write-mode"),
        window=get(f"{PROPERTY_PREFIX}window"),
        inserted=count(f"{PROPERTY_PREFIX}rows-inserted"),
        updated=count(f"{PROPERTY_PREFIX}rows-updated"),
        deleted=count(f"{PROPERTY_PREFIX}rows-deleted"),
        total=summary_rows(summary) if summary is not None else None,
        current=current,
    )


def _utc(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, tz=UTC)


def rollback(
    publisher: Publisher,
    spec: DatasetSpec,
    *,
    to_snapshot: int | None = None,
    before_run: str | None = None,
    to_time: datetime | None = None,
    reason: str | None = None,
    who: str | None = None,
    run_id: str | None = None,
    windows: WindowLog | None = None,
) -> RollbackRecord:
    """Point the dataset's main back at an earlier snapshot of its history, in one catalog
    commit, and record it (who, when, why, from, to). Exactly one target: `to_snapshot`, the
    snapshot before `before_run`'s first write, or the snapshot main pointed at at `to_time`
    (timezone-aware; `SnapshotExpired` when expiry removed the version main had then, and
    refused when a rollback took that version off main's history).

    Windows applied after the target go back to `planned` (the sensor re-applies them; none is
    planned twice). Refused (`RollbackRefused`, nothing moved) when it would break the canary: the
    dataset runs `dual` (the legacy arm is not rolled back, parity would break), or the legacy
    arm was drained after the target was main (no arm would hold the rows written since).
    """
    chosen = [x for x in (to_snapshot, before_run, to_time) if x is not None]
    if len(chosen) != 1:
        raise InvalidArgument(
            f"dataset {spec.name!r}: rollback needs exactly one of to_snapshot, before_run, to_time"
        )
    ledger = publisher.ledger
    if ledger is None:
        raise InvalidArgument("rollback needs the control-plane ledger (it is recorded there)")
    mode = publisher.resolve(spec)
    if mode.mode == "dual":
        raise RollbackRefused(
            f"dataset {spec.name!r}: rollback refused — it runs dual (from {mode.source}) and "
            "only the Iceberg arm would go back, breaking parity with the legacy arm; flip it to "
            "iceberg (or pg) first"
        )
    applying = windows.apply_lock(spec.name) if windows is not None else nullcontext()
    with applying, publisher.iceberg.tables.hold(spec) as stats:
        table = publisher.iceberg.load(spec)
        main = head(table) if table is not None else None
        if table is None or main is None:
            raise RollbackRefused(f"dataset {spec.name!r}: no snapshot on main to roll back")
        lineage = list(ancestry(table, main))
        target = _target(spec, table, lineage, to_snapshot, before_run, to_time)
        became_main = main_since(table).get(target.snapshot_id, target.timestamp_ms)
        drained = ledger.drain_log.last_drain(spec.name)
        if drained is not None and drained > _utc(became_main):
            raise RollbackRefused(
                f"dataset {spec.name!r}: rollback refused — the legacy arm was drained at "
                f"{drained:%Y-%m-%d %H:%M:%S} UTC, after snapshot {target.snapshot_id} was main "
                f"({_utc(became_main):%Y-%m-%d %H:%M:%S}); rows written since exist on no other arm"
            )
        move_main(table, target.snapshot_id, expected=main, fence=stats.verify)
        removed = set()
        for snapshot in lineage:
            if snapshot.snapshot_id == target.snapshot_id:
                break
            removed.add(snapshot.snapshot_id)
        why = f"rolled back: main {main} -> {target.snapshot_id}" + (
            f" ({reason})" if reason else ""
        )
        with ledger.connect() as conn:
            reset = (
                windows.reset_to_planned(
                    spec.name,
                    snapshot_ids=removed,
                    applied_after=_utc(became_main),
                    reason=why,
                    conn=conn,
                )
                if windows is not None
                else 0
            )
            record: RollbackRecord = ledger.rollback_log.record_rollback(
                spec.name,
                from_snapshot_id=main,
                to_snapshot_id=target.snapshot_id,
                who=who or getpass.getuser(),
                run_id=run_id,
                reason=reason,
                windows_reset=reset,
                conn=conn,
            )
    return record


def _target(
    spec: DatasetSpec,
    table: Any,
    lineage: list[Any],
    to_snapshot: int | None,
    before_run: str | None,
    to_time: datetime | None,
) -> Any:
    """The snapshot of main's history a rollback goes back to (see `rollback`)."""
    ids = {s.snapshot_id: s for s in lineage}
    where = f"(see pipeline-output history {spec.name})"
    if to_snapshot is not None:
        if to_snapshot not in ids:
            raise RollbackRefused(
                f"dataset {spec.name!r}: snapshot {to_snapshot} is not in main's history {where}"
            )
        found = ids[to_snapshot]
    elif before_run is not None:
        key = f"{PROPERTY_PREFIX}run-id"
        written = [s for s in lineage if s.summary is not None and s.summary.get(key) == before_run]
        if not written:
            raise RollbackRefused(
                f"dataset {spec.name!r}: run {before_run} wrote no snapshot on main {where}"
            )
        parent = written[-1].parent_snapshot_id
        if parent is None or parent not in ids:
            raise RollbackRefused(
                f"dataset {spec.name!r}: run {before_run} wrote the table's first snapshot; there "
                "is nothing before it to roll back to"
            )
        found = ids[parent]
    else:
        assert to_time is not None
        # refused when expiry removed the version main had then (`snapshot_log`): never another
        moment = snapshot_at(table, to_time, dataset=spec.name, what="--to-time")
        if moment not in ids:
            raise RollbackRefused(
                f"dataset {spec.name!r}: at {to_time.isoformat()} main pointed at snapshot "
                f"{moment}, which is no longer in main's history (a rollback took it off) {where}"
            )
        found = ids[moment]
    if found.snapshot_id == lineage[0].snapshot_id:
        raise RollbackRefused(
            f"dataset {spec.name!r}: main already points at snapshot {found.snapshot_id}; "
            "nothing to roll back"
        )
    return found
