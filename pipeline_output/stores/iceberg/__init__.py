"""The native arm: `IcebergStore` writes every write mode as one atomic commit and reads back.

`store.IcebergStore` owns the order of a write (its docstring); `prewrite` the files written
before the lock, `merge` the file-level copy-on-write merges, `streaming` the model node's
streaming replace, `commit` the single commit, `expressions` windows as pyiceberg filters,
`rows` frame and table helpers, `properties` the names they share. Table maintenance:
`compaction` (+ `compaction_plan`, `rewrite`: the `replace` producer), `expiry`, `orphans`
(what a table references; shared with `pipeline-output doctor`), `inflight` (no sweep deletes
the files of a write in flight), `health`.
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
