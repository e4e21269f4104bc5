"""Maintenance of a native table: compaction, snapshot expiry, orphan removal and health.

`TableMaintenance` is the accessor the store returns (`store.maintenance`, as pyiceberg's
`table.maintenance` or delta-rs's `DeltaTable.optimize`): one object that owns the table
operations of maintenance, each a function of its own module — `compaction.compact`,
`expiry.expire_snapshots`, `orphans.remove_orphans` (what a table references, shared with
`services/doctor.py`) and `health.table_health`.
"""

from __future__ import annotations

from typing import Any

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.maintenance.compaction import CompactionResult, compact
from pipeline_output.stores.iceberg.maintenance.expiry import ExpiryResult, expire_snapshots
from pipeline_output.stores.iceberg.maintenance.health import TableHealth, table_health
from pipeline_output.stores.iceberg.maintenance.orphans import OrphanResult, remove_orphans
from pipeline_output.stores.iceberg.table.tables import IcebergTables


class TableMaintenance:
    """Maintenance of the datasets' tables in one namespace (`IcebergStore.maintenance`)."""

    def __init__(self, tables: IcebergTables) -> None:
        self.tables = tables

    def compact(self, spec: DatasetSpec, **options: Any) -> CompactionResult:
        """Small files (and files with delete files) rewritten near the target size, in one
        `replace` commit (`compaction.compact`: `target_file_size`, `min_input_files`, `where`,
        `dry_run`)."""
        return compact(self, spec, **options)

    def expire_snapshots(self, spec: DatasetSpec, **options: Any) -> ExpiryResult:
        """Old snapshots removed and the files only they referenced deleted
        (`expiry.expire_snapshots`: `older_than`, `retain_last`, `ledger`, `dry_run`)."""
        return expire_snapshots(self, spec, **options)

    def remove_orphans(self, spec: DatasetSpec, **options: Any) -> OrphanResult:
        """Files under the table's location nothing references, past the grace period, deleted —
        never a write's in flight (`orphans.remove_orphans`: `grace_s`, `dry_run`, `wait_s`)."""
        return remove_orphans(self, spec, **options)

    def health(self, spec: DatasetSpec | str) -> TableHealth | None:
        """The table's health (files a read plans over, history, last maintenance); None when
        the table does not exist."""
        table = self.tables.load(spec)
        return table_health(table) if table is not None else None
