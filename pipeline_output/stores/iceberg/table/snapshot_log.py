"""Which snapshot main pointed at, at a given time — and which times can still be answered once
snapshot expiry has removed part of main's history.

The table's snapshot log lists every move of main (time, snapshot), oldest first; main pointed at
an entry's snapshot from its time until the next entry's. Expiry removes the entries of the
snapshots it removes (pyiceberg keeps every other entry; Java Iceberg drops the whole log before
the last removed one). Once an entry is gone, the entry before it seems to last until the next
surviving one, and a lookup in between would answer with a version main did not point at then.

**The rule.** Times are answered only from the *answerable* part of the log: from the first entry
after the last known gap on (`answerable_from`). An earlier time is refused (`SnapshotExpired`,
naming the dataset and that earliest time), never answered with another version. A gap is known
from

- the boundary our expiry records, in its own commit, in the table property
  `pipeline-output.time-travel-from` (`expiry_boundary`: the time of the first surviving entry
  after the last entry it removes), and
- the log itself, for expiries by other tools (or by versions of this project that did not record
  the boundary): an entry whose snapshot the table no longer has; two consecutive entries of one
  snapshot (main left it and came back, and what it pointed at in between is gone); a snapshot
  committed straight onto main — its entry's time is its own commit time — whose parent is not the
  previous entry's snapshot (main pointed at that parent just before the commit, so the parent's
  entry is gone; pyiceberg also clears a parent id that expiry removed).

A move of main to an existing snapshot (a rollback, a publish) proves nothing either way, so an
expiry by another tool hidden right before one is not detected from the log; ours always records
its boundary. A snapshot id stays readable while the table has it (a tag keeps one), even when
its time is no longer answerable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from pipeline_output.errors import InvalidArgument, SnapshotExpired
from pipeline_output.stores.iceberg.table.tables import PROPERTY_PREFIX, to_millis

TRAVEL_FROM = f"{PROPERTY_PREFIX}time-travel-from"  # table property: set by our expiry


@dataclass(frozen=True)
class MainLog:
    """Main's snapshot log and the part of it that answers time lookups."""

    entries: list[tuple[int, int]]  # (epoch ms, snapshot id), oldest first
    answerable_from: int | None  # epoch ms; None: main never pointed at a snapshot
    expired: bool  # a gap is known: history before `answerable_from` was removed


def stamp(millis: int) -> str:
    """An epoch-ms time as the ISO-8601 text errors name (UTC, milliseconds: as_of takes it)."""
    return datetime.fromtimestamp(millis / 1000, tz=UTC).isoformat(timespec="milliseconds")


def main_log(metadata: TableMetadata) -> MainLog:
    """The table's snapshot log with its answerable part (module docstring)."""
    entries = [(e.timestamp_ms, e.snapshot_id) for e in metadata.snapshot_log]
    if not entries:
        return MainLog(entries=[], answerable_from=None, expired=False)
    recorded = _recorded(metadata)
    seen = _gap_end(metadata, entries)
    start = entries[0][0]
    ends = [x for x in (recorded, seen) if x is not None]
    return MainLog(
        entries=entries,
        answerable_from=max([start, *ends]),
        expired=bool(ends) or _history_cut_before(metadata, entries[0]),
    )


def _recorded(metadata: TableMetadata) -> int | None:
    raw = metadata.properties.get(TRAVEL_FROM)
    if not raw:
        return None
    try:
        return to_millis(datetime.fromisoformat(raw), what=TRAVEL_FROM)
    except ValueError:
        return None  # not ours to trust: the log alone decides


def _gap_end(metadata: TableMetadata, entries: list[tuple[int, int]]) -> int | None:
    """The time of the first entry after the last gap the log itself shows (None: none)."""
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    end: int | None = None
    for i, (millis, snapshot_id) in enumerate(entries):
        snapshot = by_id.get(snapshot_id)
        if snapshot is None:  # a stale entry: nothing up to it can be trusted
            end = entries[i + 1][0] if i + 1 < len(entries) else millis + 1
            continue
        if i == 0:
            continue
        previous = entries[i - 1][1]
        committed_here = snapshot.timestamp_ms == millis
        if previous == snapshot_id or (committed_here and snapshot.parent_snapshot_id != previous):
            end = millis
    return end


def _history_cut_before(metadata: TableMetadata, first: tuple[int, int]) -> bool:
    """True when the first entry is a commit onto a parent main pointed at before (whose entry
    is gone): the log does not reach back to the table's first snapshot on main."""
    snapshot = metadata.snapshot_by_id(first[1])
    return (
        snapshot is not None
        and snapshot.timestamp_ms == first[0]
        and snapshot.parent_snapshot_id is not None
    )


def expiry_boundary(metadata: TableMetadata, removed: set[int]) -> int | None:
    """What an expiry removing `removed` records: the time of the first log entry after the last
    entry it removes, or of the boundary already recorded if later (None: it removes no entry)."""
    entries = metadata.snapshot_log
    last = max((i for i, e in enumerate(entries) if e.snapshot_id in removed), default=None)
    if last is None or last + 1 >= len(entries):
        return None
    found = entries[last + 1].timestamp_ms
    recorded = _recorded(metadata)
    return max(found, recorded) if recorded is not None else found


def snapshot_at(table: Table, moment: datetime, *, dataset: str, what: str = "as_of") -> int:
    """The snapshot main pointed at, at `moment` (timezone-aware), if that time is answerable
    (module docstring): `SnapshotExpired` for a time before the answerable part of the log, and
    `InvalidArgument` for a time before main's first snapshot — both name the earliest time that
    can be answered."""
    millis = to_millis(moment, what=f"dataset {dataset!r}: {what}")
    log = main_log(table.metadata)
    where = f"(see pipeline-output history {dataset})"
    if log.answerable_from is None:
        raise InvalidArgument(
            f"dataset {dataset!r}: main had no snapshot at {moment.isoformat()} (it has none yet)"
        )
    earliest = stamp(log.answerable_from)
    if millis < log.answerable_from:
        if log.expired:
            raise SnapshotExpired(
                f"dataset {dataset!r}: {what} {moment.isoformat()} cannot be answered: snapshot "
                f"expiry removed a version main pointed at between then and {earliest}, so "
                "which one main had then is no longer known; the earliest time that can be "
                f"answered is {earliest} {where}"
            )
        raise InvalidArgument(
            f"dataset {dataset!r}: main had no snapshot at {moment.isoformat()}; the earliest "
            f"time that can be answered is {earliest} {where}"
        )
    found = [sid for at, sid in log.entries if at <= millis][-1]
    if table.snapshot_by_id(found) is None:  # a stale last entry: not ours to answer with
        raise SnapshotExpired(f"dataset {dataset!r}: snapshot {found} of main's log is gone")
    return int(found)


def resolve_as_of(table: Table, as_of: int | datetime, *, dataset: str) -> int:
    """The snapshot id `as_of` names: a snapshot id of `table`, or the snapshot main pointed at
    at a timezone-aware time (`snapshot_at`); anything else is `InvalidArgument`."""
    if isinstance(as_of, datetime):
        return snapshot_at(table, as_of, dataset=dataset)
    if isinstance(as_of, bool) or not isinstance(as_of, int):
        raise InvalidArgument(
            f"dataset {dataset!r}: as_of must be a snapshot id or a timezone-aware datetime, "
            f"got {as_of!r}"
        )
    if table.snapshot_by_id(as_of) is None:
        raise InvalidArgument(
            f"dataset {dataset!r} has no snapshot {as_of} (expired, or never one of its "
            f"snapshots; see pipeline-output history {dataset})"
        )
    return as_of


def pinned_snapshot_gone(table: Table, snapshot_id: int, *, dataset: str) -> Exception | None:
    """For a read pinned to `snapshot_id` that found a file missing: `SnapshotExpired` when the
    table (loaded again) no longer has that snapshot — expiry removed it and its files after the
    read was set up; None when it still has it (the missing file is another matter)."""
    try:
        now: Any = table.catalog.load_table(table.name())
    except Exception:  # the table itself is gone: that is the error to show, not ours
        return None
    if now.snapshot_by_id(snapshot_id) is not None:
        return None
    since = main_log(now.metadata).answerable_from
    after = f"; the earliest time that can be answered is {stamp(since)}" if since else ""
    return SnapshotExpired(
        f"dataset {dataset!r}: snapshot {snapshot_id}, which this lazy read is pinned to, was "
        f"removed by snapshot expiry (with its files) before the read was collected{after}; "
        "load the input again (keep expiry's older_than above your longest run)"
    )
