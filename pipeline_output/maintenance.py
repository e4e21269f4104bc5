"""Table maintenance, the public API: `maintain` runs any of the four operations over datasets
(`MaintenanceOptions`: drop stale audit branches, compact, expire snapshots, remove orphans) and
reports before/after; `compact`, `expire_snapshots` and `remove_orphans` are each one operation on
one table (functions of `(store, spec)`, also `IcebergStore.maintenance` methods);
`HealthThresholds` are the limits the `table_health` check measures against.

`pipeline-output maintain` and the `table_maintenance` Dagster job call the same functions. The
implementation lives in `services/maintenance.py` (runs over datasets) and
`stores/iceberg/maintenance/` (the table operations); this module only names the public part.
"""

from __future__ import annotations

from pipeline_output.services.maintenance import MaintenanceOptions, maintain
from pipeline_output.stores.iceberg.maintenance.compaction import compact
from pipeline_output.stores.iceberg.maintenance.expiry import expire_snapshots
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds
from pipeline_output.stores.iceberg.maintenance.orphans import remove_orphans

__all__ = [
    "HealthThresholds",
    "MaintenanceOptions",
    "compact",
    "expire_snapshots",
    "maintain",
    "remove_orphans",
]
