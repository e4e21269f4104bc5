"""Doctor: find (and optionally remove) orphan data files in the warehouse.

A failed or killed write can leave data files that no snapshot references (files are written
before the single commit). An orphan is a Parquet file under a table's `data/` directory that no
snapshot of the table references (`stores/iceberg/maintenance/orphans.py` owns the rule, shared with
`pipeline-output maintain --orphans`, which also sweeps the metadata directory), and that is older
than a grace period. Removal deletes only the files still unreferenced once no write of the table
is in flight (`stores/iceberg/snapshot/commit.py`), so a write in progress never loses a file, whatever
the grace. Pure core (no Dagster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from pipeline_output.stores.iceberg.maintenance.orphans import (
    DEFAULT_GRACE_S,
    Orphan,
    sweep_table,
    table_orphans,
)
from pipeline_output.stores.iceberg.maintenance.orphans import referenced as _referenced
from pipeline_output.stores.iceberg.snapshot.commit import DEFAULT_WAIT_S

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.store import IcebergStore

__all__ = ["DEFAULT_GRACE_S", "Orphan", "find_orphans", "referenced_files", "remove_orphans"]


def referenced_files(table: Table) -> set[str]:
    """Every file path any snapshot of `table` (or its metadata) references."""
    return _referenced(table)


def find_orphans(
    catalog: Catalog, namespace: str, *, grace_s: float = DEFAULT_GRACE_S
) -> list[Orphan]:
    """Orphan data files of every table in `namespace`, older than `grace_s`."""
    out: list[Orphan] = []
    for identifier in catalog.list_tables(namespace):
        out.extend(table_orphans(catalog.load_table(identifier), grace_s=grace_s, data_only=True))
    return out


def remove_orphans(
    orphans: list[Orphan], *, store: IcebergStore, wait_s: float = DEFAULT_WAIT_S
) -> int:
    """Delete those of the given orphan files (from `find_orphans` on `store`'s catalog) that are
    still orphans once no write of their table is in flight; returns how many were removed.
    `LockUnavailable` when a table's writes stay in flight longer than `wait_s` (the tables
    before it are done)."""
    by_table: dict[str, list[Orphan]] = {}
    for orphan in orphans:
        by_table.setdefault(orphan.table, []).append(orphan)
    removed = 0
    for table, found in by_table.items():
        dataset = table.rsplit(".", 1)[-1]
        removed += len(sweep_table(store, table, found, dataset=dataset, wait_s=wait_s)[0])
    return removed
