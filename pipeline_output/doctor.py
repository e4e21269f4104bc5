"""Doctor: find (and optionally remove) orphan data files in the warehouse.

A failed or killed write can leave data files that no snapshot references (files are written
before the single commit). An orphan is a Parquet file under a table's `data/` directory that no
snapshot of the table references (`stores/iceberg/orphans.py` owns the rule, shared with
`pipeline-output maintain --orphans`, which also sweeps the metadata directory), and that is older
than a grace period (so a write in progress, whose files are not committed yet, is never
touched). Pure core (no Dagster).
"""

from __future__ import annotations

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from pipeline_output.stores.iceberg.orphans import (
    DEFAULT_GRACE_S,
    Orphan,
    delete_orphans,
    table_orphans,
)
from pipeline_output.stores.iceberg.orphans import referenced as _referenced

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


def remove_orphans(orphans: list[Orphan]) -> int:
    """Delete the given orphan files; returns how many were removed."""
    return delete_orphans(orphans)
