"""The table a write to a branch plans against (`IcebergStore.write(branch=...)`).

A view whose main is the branch head (`tables.at_branch`); a table that does not exist, or has
no snapshot at all, is first created — or given — an unreferenced empty snapshot, since Iceberg
writes branches only into tables that have one (`tables.anchor`): its main stays unset, so the
freshness oracle still sees a first deploy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.table import Table, Transaction

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import WriteConflict
from pipeline_output.stores.iceberg.snapshot.manifests import FlatTransaction
from pipeline_output.stores.iceberg.table.tables import anchor, at_branch, needs_anchor

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables


def branch_view(
    store: HasTables, spec: DatasetSpec, table: Table | None, frame: pl.DataFrame, branch: str
) -> Table:
    """The table a write to `branch` plans against (see the module docstring); call it under the
    table's writer lock."""
    if needs_anchor(table):
        tx: Transaction = (
            store.tables.create_transaction(spec, frame)
            if table is None
            else FlatTransaction(table)
        )
        try:
            table = anchor(tx)
        except TableAlreadyExistsError as exc:
            raise WriteConflict(
                f"dataset {spec.name!r}: {store.tables.table_name(spec)} was created by another writer "
                "after this write was planned; nothing was committed — run it again"
            ) from exc
    assert table is not None
    return at_branch(table, branch)
