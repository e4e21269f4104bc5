"""Iceberg's `replace` operation: data files swapped for files holding the same rows.

Owns the snapshot producer of table maintenance (`ReplaceFiles`): the write path's
`indexed_overwrite.IndexedOverwrite` (planned from a `ManifestIndex`, delete files in `deletes`
manifests, file-scoped delete files removed with their data file, manifests merged on commit)
whose snapshot says what it is — summary operation `replace`, so readers and engines know the
table's rows did not change — and that refuses to commit on a snapshot it was not planned on.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.table import Transaction
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.typedef import EMPTY_DICT

from pipeline_output.errors import MaintenanceConflict
from pipeline_output.stores.iceberg.snapshot.indexed_overwrite import IndexedOverwrite
from pipeline_output.stores.iceberg.snapshot.manifests import ManifestIndex


class ReplaceFiles(IndexedOverwrite):
    """The `replace` producer: `delete_data_file` takes data files and delete files alike.

    It needs the index of the snapshot it commits on (the caller re-reads it under the table lock);
    a replace planned on other files would lose rows, so another head is a `MaintenanceConflict`.
    """

    def __init__(
        self,
        transaction: Transaction,
        *,
        index: ManifestIndex,
        snapshot_properties: dict[str, str],
    ) -> None:
        super().__init__(
            transaction,
            transaction._table.io,
            index=index,
            snapshot_properties=snapshot_properties,
        )
        if self._indexed() is None:
            raise MaintenanceConflict(
                f"table {index.table_name!r}: the replace was planned on snapshot "
                f"{index.snapshot_id}, the table is at {self._parent_snapshot_id}"
            )

    def _summary(self, snapshot_properties: Mapping[str, str] = EMPTY_DICT) -> Summary:
        # pyiceberg's totals only know append/overwrite/delete: compute them as an overwrite
        # (the same file accounting), then name the operation for what it is.
        summary = super()._summary(dict(snapshot_properties))
        return Summary(operation=Operation.REPLACE, **summary.additional_properties)
