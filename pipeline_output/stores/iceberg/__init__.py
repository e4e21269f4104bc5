"""The native arm: `IcebergStore` writes every write mode as one atomic commit and reads back.

`store.IcebergStore` owns the order of a write (its docstring). By role:
`table/` the table as it is (`tables`: naming, loading, its properties, refs and branches, its
state; `partitions`: its partition spec and windows as pyiceberg filters; `native_scan` and
`scan_planning` reads; `manifest_decoding` reading manifests); `write/` a write before its commit
(`prepare.prewrite` the files written before the lock, `merge` the file-level merges, `key_scan`
which target rows a merge touches, `frame_rows` frame helpers and the rewritten rows,
`streaming` the model node's streaming replace); `snapshot/` the files and the one commit
(`commit`: the producers, the one commit, and the in-flight registry by which no sweep deletes
the files of a write in flight; `files`, `manifests`, `summary`); `maintenance/` (`compaction`, `expiry`, `orphans`
— what a table references, shared with `pipeline-output doctor` — and `health`).
"""

from __future__ import annotations

from pipeline_output.stores.iceberg.snapshot.commit import summary_properties
from pipeline_output.stores.iceberg.store import IcebergStore
from pipeline_output.stores.iceberg.table.partitions import aligned_to_field, window_filter
from pipeline_output.stores.iceberg.table.tables import PROPERTY_PREFIX, TABLE_PROPERTIES
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
