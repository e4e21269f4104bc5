"""The native arm: `IcebergStore` writes every write mode as one atomic commit and reads back.

`store.IcebergStore` owns the order of a write (its docstring). By role:
`table/` the table as it is (`tables` loading and naming, `refs` branches, `expressions` windows
as pyiceberg filters, `properties` the names they share, `native_scan` reads); `write/` a write
before its commit (`prepare.prewrite` the files written before the lock, `merge` the file-level
merges, `streaming` the model node's streaming replace); `snapshot/` the files and the one commit
(`commit`, `indexed_overwrite` and `replace_files` the producers, `manifests`, `inflight`: no
sweep deletes the files of a write in flight); `maintenance/` (`compaction`, `expiry`, `orphans`
— what a table references, shared with `pipeline-output doctor` — and `health`).
"""

from __future__ import annotations

from pipeline_output.stores.iceberg.snapshot.summary import summary_properties
from pipeline_output.stores.iceberg.store import IcebergStore
from pipeline_output.stores.iceberg.table.expressions import aligned_to_field, window_filter
from pipeline_output.stores.iceberg.table.properties import PROPERTY_PREFIX, TABLE_PROPERTIES
from pipeline_output.stores.iceberg.write.prepare import PreparedWrite

__all__ = [
    "PROPERTY_PREFIX",
    "TABLE_PROPERTIES",
    "IcebergStore",
    "PreparedWrite",
    "aligned_to_field",
    "summary_properties",
    "window_filter",
]
