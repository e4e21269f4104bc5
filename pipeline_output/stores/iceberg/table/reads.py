"""The native arm's reads: the current rows (a window, some columns), a past version (`as_of`:
a snapshot id or the time main pointed at it), and the attempt-marker lookup of exactly-once
repair, which only counts snapshots in main's history (not an audit branch's, not rolled back).
Functions over a namespace's tables (`tables.IcebergTables`); `IcebergStore` exposes them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Unpack

import polars as pl
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from pipeline_output.contract.checked_input import from_arrow
from pipeline_output.contract.spec import DatasetSpec, window_column
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER, ReadOptions
from pipeline_output.errors import DatasetNotWritten
from pipeline_output.stores.iceberg.table.expressions import window_filter
from pipeline_output.stores.iceberg.table.properties import PROPERTY_PREFIX
from pipeline_output.stores.iceberg.table.refs import ancestry, head
from pipeline_output.stores.iceberg.table.snapshot_log import resolve_as_of
from pipeline_output.stores.iceberg.table.tables import IcebergTables


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
    whose version expiry removed: `SnapshotExpired`, see `snapshot_log`)."""
    window, columns = options.get("window"), options.get("columns")
    table = tables.load(spec)
    if table is None:
        raise DatasetNotWritten(f"dataset {tables.table_name(spec)!r} has no Iceberg table yet")
    snapshot_id = snapshot_as_of(tables, spec, as_of, table=table) if as_of is not None else None
    schema = table.schema()
    if snapshot_id is not None:
        schema = table.schemas().get(table.snapshot_by_id(snapshot_id).schema_id, schema)  # type: ignore[union-attr,arg-type]
    row_filter: BooleanExpression = AlwaysTrue()
    if window is not None:
        wm = window_column(spec, options.get("watermark"))
        row_filter = window_filter(wm, window, schema=schema)
    scan = table.scan(
        row_filter=row_filter,
        selected_fields=tuple(columns) if columns else ("*",),
        snapshot_id=snapshot_id,
    )
    return from_arrow(scan.to_arrow())


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
