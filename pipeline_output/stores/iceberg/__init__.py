"""The native arm: `IcebergStore` (`store.py`, the order of a write) writes every write mode as one
atomic commit and reads back. Below it, by role: `table/` the table as it is, `write/` a write
before its commit, `snapshot/` the files, manifests and the one commit, `maintenance/` table
maintenance. Its modules, by concept: `docs/concepts.md`, "Where each concept lives".
"""

from __future__ import annotations

from pipeline_output.infra.deferred_imports import defer_all

# before any module below imports `pyiceberg.io.pyarrow`: its `pyarrow.dataset` (and pandas) is
# loaded on first use, which reads and writes with polars never make (`infra/deferred_imports.py`)
defer_all()

from pipeline_output.stores.iceberg.snapshot.commit import summary_properties  # noqa: E402
from pipeline_output.stores.iceberg.store import IcebergStore  # noqa: E402
from pipeline_output.stores.iceberg.table.partitions import (  # noqa: E402
    aligned_to_field,
    window_filter,
)
from pipeline_output.stores.iceberg.table.tables import (  # noqa: E402
    PROPERTY_PREFIX,
    TABLE_PROPERTIES,
)
from pipeline_output.stores.iceberg.write.prepare import PreparedWrite  # noqa: E402

__all__ = [
    "PROPERTY_PREFIX",
    "TABLE_PROPERTIES",
    "IcebergStore",
    "PreparedWrite",
    "aligned_to_field",
    "summary_properties",
    "window_filter",
]
