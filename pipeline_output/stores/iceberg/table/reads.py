"""The native arm's reads: the current rows (a window, some columns), a past version (`as_of`:
a snapshot id or the time main pointed at it), and the attempt-marker lookup of exactly-once
repair, which only counts snapshots in main's history (not an audit branch's, not rolled back) —
by equality (`find_marker`) or the newest under a key (`last_summary`: an incremental
downstream's consumed range).
Functions over a namespace's tables (`tables.IcebergTables`); `IcebergStore` exposes them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Unpack

import polars as pl
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from pipeline_output.contract.spec import DatasetSpec, window_column
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER, ReadOptions
from pipeline_output.errors import DatasetNotWritten, InvalidArgument
from pipeline_output.stores.iceberg.table.native_scan import (
    quiet,
    snapshot_scan,
    snapshot_schema,
    target_schema,
    typed,
)
from pipeline_output.stores.iceberg.table.snapshot_log import resolve_as_of
from pipeline_output.stores.iceberg.table.tables import (
    PROPERTY_PREFIX,
    IcebergTables,
    ancestry,
    head,
)


def read(
    tables: IcebergTables,
    spec: DatasetSpec | str,
    *,
    as_of: int | datetime | None = None,
    **options: Unpack[ReadOptions],
) -> pl.DataFrame:
    """The table's rows (optionally only a window, only some columns) as polars.

    `as_of` reads a past version (time travel): a snapshot id, or a timezone-aware datetime
    — the snapshot `main` pointed at then (a naive datetime is refused, and so is a time
    whose version expiry removed: `SnapshotExpired`, see `snapshot_log`).

    Read by polars' native Iceberg scan (`native_scan`): only the selected columns' chunks,
    the window pushed down to the file statistics and the row groups."""
    window, columns = options.get("window"), options.get("columns")
    table = tables.load(spec)
    if table is None:
        raise DatasetNotWritten(f"dataset {tables.table_name(spec)!r} has no Iceberg table yet")
    if as_of is not None:  # a past version: its snapshot's columns
        snapshot_id: int | None = snapshot_as_of(tables, spec, as_of, table=table)
        target = target_schema(snapshot_schema(table, snapshot_id))
    else:  # the current state: today's columns (one added since the last commit reads as null)
        current = table.current_snapshot()
        snapshot_id = current.snapshot_id if current is not None else None
        target = target_schema(table.schema())
    names = list(columns) if columns else list(target)
    unknown = [c for c in names if c not in target]
    if unknown:
        raise InvalidArgument(
            f"dataset {tables.table_name(spec)!r} has no column(s) {unknown} "
            f"(columns: {list(target)})"
        )
    if snapshot_id is None:  # a table without a committed snapshot: no rows
        return pl.DataFrame(schema={c: target[c] for c in names})
    frame = snapshot_scan(table, snapshot_id if as_of is not None else None)
    if window is not None:
        wm = window_column(spec, options.get("watermark"))
        if wm not in target:
            raise InvalidArgument(
                f"dataset {tables.table_name(spec)!r}: reading window {window} needs the "
                f"watermark column {wm!r} (columns: {list(target)})"
            )
        frame = frame.filter(window.aligned_to(target[wm]).contains(wm, target[wm]))
    with quiet():
        return typed(frame.select(names).collect(), target)


def snapshot_as_of(
    tables: IcebergTables,
    spec: DatasetSpec | str,
    as_of: int | datetime,
    *,
    table: Table | None = None,
) -> int:
    """The snapshot id `as_of` names in the dataset's table: a snapshot id of the table, or
    the snapshot main pointed at at a timezone-aware time (`InvalidArgument` otherwise;
    `SnapshotExpired` for a time expiry made unanswerable)."""
    table = table if table is not None else tables.load(spec)
    if table is None:
        raise DatasetNotWritten(f"dataset {tables.table_name(spec)!r} has no Iceberg table yet")
    return resolve_as_of(table, as_of, dataset=tables.identifier(spec)[1])


def find_marker(
    tables: IcebergTables, spec: DatasetSpec | str, marker: str, *, ref: str = MAIN_BRANCH
) -> int | None:
    """The snapshot in `ref`'s history (main's: what readers see) whose summary carries the
    window attempt `marker`, if any. A snapshot only on an audit branch, or rolled back off
    main, does not count."""
    table = tables.load(spec)
    if table is None:
        return None
    key = f"{PROPERTY_PREFIX}{ATTEMPT_MARKER}"
    for snap in ancestry(table, head(table, ref)):
        if snap.summary is not None and snap.summary.get(key) == marker:
            return snap.snapshot_id
    return None


def last_summary(
    tables: IcebergTables, spec: DatasetSpec | str, key: str, *, ref: str = MAIN_BRANCH
) -> tuple[int, str] | None:
    """The newest snapshot in `ref`'s history whose summary carries the property `key` (without
    the `pipeline-output.` prefix), and its value; None when none does."""
    table = tables.load(spec)
    if table is None:
        return None
    full = f"{PROPERTY_PREFIX}{key}"
    for snap in ancestry(table, head(table, ref)):
        value = snap.summary.get(full) if snap.summary is not None else None
        if value is not None:
            return snap.snapshot_id, value
    return None
