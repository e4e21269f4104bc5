"""pipeline-output: materialise produced datasets into Apache Iceberg with dbt-grade write strategies.

The public Python API, loaded on first use so `import pipeline_output` (and the CLI) stays fast and
the pure core never imports Dagster: the runtime for a control plane and a catalog (`connect` ->
`Runtime`: stores, ledgers, `Publisher`), specs and planning (`DatasetSpec`, `Delta`, `Window`,
`plan_write`), the arms (`IcebergStore`, `PostgresStore`), results and errors, write-audit-publish,
rollback and time travel (`publish_audit`, `drop_stale_audit_branches`, `rollback`, `history`), table
maintenance (`compact`, `expire_snapshots`, `remove_orphans`, `maintain`), and the Dagster layer
(`dataset`, `postgres_source`, `iceberg_source`, `model_node`, `build_definitions`,
`DatasetIOManager`, `PipelineOutputResource`, and `PipelineOutputComponent` for `dg` projects).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from pipeline_output.contract.version import VERSION as __version__
from pipeline_output.infra.collector import imports_paused

_EXPORTS = {
    # errors
    "AuditConflict": "pipeline_output.errors",
    "AuditFailed": "pipeline_output.errors",
    "RollbackRefused": "pipeline_output.errors",
    "BadInput": "pipeline_output.errors",
    "DuplicateKeys": "pipeline_output.errors",
    "EmptyComputeRefused": "pipeline_output.errors",
    "InvalidSpec": "pipeline_output.errors",
    "LockUnavailable": "pipeline_output.errors",
    "MaintenanceConflict": "pipeline_output.errors",
    "MissingKeyColumn": "pipeline_output.errors",
    "NullKey": "pipeline_output.errors",
    "PipelineOutputError": "pipeline_output.errors",
    "RowsOutsideWindow": "pipeline_output.errors",
    "SchemaMismatch": "pipeline_output.errors",
    "SettingsError": "pipeline_output.errors",
    "UnsupportedWrite": "pipeline_output.errors",
    "WriteConflict": "pipeline_output.errors",
    # core
    "DatasetSpec": "pipeline_output.contract.spec",
    "Delta": "pipeline_output.contract.spec",
    "Window": "pipeline_output.contract.windows",
    "TargetState": "pipeline_output.contract.plan",
    "WritePlan": "pipeline_output.contract.plan",
    "plan_write": "pipeline_output.contract.plan",
    "WriteResult": "pipeline_output.contract.result",
    "IcebergStore": "pipeline_output.stores.iceberg",
    "PostgresStore": "pipeline_output.stores.postgres",
    "Publisher": "pipeline_output.services.publish",
    "connect": "pipeline_output.services.runtime",
    "Runtime": "pipeline_output.services.runtime",
    # write-audit-publish, rollback, time travel
    "publish_audit": "pipeline_output.services.audit",
    "drop_stale_audit_branches": "pipeline_output.services.audit_cleanup",
    "rollback": "pipeline_output.services.time_travel",
    "history": "pipeline_output.services.time_travel",
    # table maintenance (functions of (store, spec); also IcebergStore methods)
    "compact": "pipeline_output.stores.iceberg.maintenance.compaction",
    "expire_snapshots": "pipeline_output.stores.iceberg.maintenance.expiry",
    "remove_orphans": "pipeline_output.stores.iceberg.maintenance.orphans",
    "maintain": "pipeline_output.services.maintenance",
    "MaintenanceOptions": "pipeline_output.services.maintenance",
    "HealthThresholds": "pipeline_output.stores.iceberg.maintenance.health",
    # Dagster layer
    "dataset": "pipeline_output.dagster_layer.dataset",
    "postgres_source": "pipeline_output.dagster_layer.source_assets",
    "iceberg_source": "pipeline_output.dagster_layer.source_assets",
    "model_node": "pipeline_output.dagster_layer.model_node",
    "build_definitions": "pipeline_output.dagster_layer.build",
    "DatasetIOManager": "pipeline_output.dagster_layer.io_manager",
    "PipelineOutputResource": "pipeline_output.dagster_layer.resource",
    "PipelineOutputComponent": "pipeline_output.dagster_layer.component",
}

__all__ = [
    "AuditConflict",
    "AuditFailed",
    "BadInput",
    "DatasetIOManager",
    "DatasetSpec",
    "Delta",
    "DuplicateKeys",
    "EmptyComputeRefused",
    "HealthThresholds",
    "IcebergStore",
    "InvalidSpec",
    "LockUnavailable",
    "MaintenanceConflict",
    "MaintenanceOptions",
    "MissingKeyColumn",
    "NullKey",
    "PipelineOutputComponent",
    "PipelineOutputError",
    "PipelineOutputResource",
    "PostgresStore",
    "Publisher",
    "RollbackRefused",
    "RowsOutsideWindow",
    "Runtime",
    "SchemaMismatch",
    "SettingsError",
    "TargetState",
    "UnsupportedWrite",
    "Window",
    "WriteConflict",
    "WritePlan",
    "WriteResult",
    "__version__",
    "build_definitions",
    "compact",
    "connect",
    "dataset",
    "drop_stale_audit_branches",
    "expire_snapshots",
    "history",
    "iceberg_source",
    "maintain",
    "model_node",
    "plan_write",
    "postgres_source",
    "publish_audit",
    "remove_orphans",
    "rollback",
]


def __dir__() -> list[str]:
    """Every public name, loaded or not: `dir()`, IDEs and `help()` see the API though its names
    load on first use (and `dg` finds the Component by listing the package)."""
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__")})


def __getattr__(name: str) -> Any:
    """Load an exported name from its module on first use (a module not imported yet is imported
    with the garbage collector paused, then frozen: `infra/collector.py`)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline_output' has no attribute {name!r}")
    if module in sys.modules:
        loaded = sys.modules[module]
    else:
        with imports_paused():
            loaded = importlib.import_module(module)
    value = getattr(loaded, name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from pipeline_output.contract.plan import TargetState, WritePlan, plan_write
    from pipeline_output.contract.result import WriteResult
    from pipeline_output.contract.spec import DatasetSpec, Delta
    from pipeline_output.contract.windows import Window
    from pipeline_output.dagster_layer.build import build_definitions
    from pipeline_output.dagster_layer.component import PipelineOutputComponent
    from pipeline_output.dagster_layer.dataset import dataset
    from pipeline_output.dagster_layer.io_manager import DatasetIOManager
    from pipeline_output.dagster_layer.model_node import model_node
    from pipeline_output.dagster_layer.resource import PipelineOutputResource
    from pipeline_output.dagster_layer.source_assets import iceberg_source, postgres_source
    from pipeline_output.errors import (
        AuditConflict,
        AuditFailed,
        BadInput,
        DuplicateKeys,
        EmptyComputeRefused,
        InvalidSpec,
        LockUnavailable,
        MaintenanceConflict,
        MissingKeyColumn,
        NullKey,
        PipelineOutputError,
        RollbackRefused,
        RowsOutsideWindow,
        SchemaMismatch,
        SettingsError,
        UnsupportedWrite,
        WriteConflict,
    )
    from pipeline_output.services.audit import publish_audit
    from pipeline_output.services.audit_cleanup import drop_stale_audit_branches
    from pipeline_output.services.maintenance import MaintenanceOptions, maintain
    from pipeline_output.services.publish import Publisher
    from pipeline_output.services.runtime import Runtime, connect
    from pipeline_output.services.time_travel import history, rollback
    from pipeline_output.stores.iceberg import IcebergStore
    from pipeline_output.stores.iceberg.maintenance.compaction import compact
    from pipeline_output.stores.iceberg.maintenance.expiry import expire_snapshots
    from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds
    from pipeline_output.stores.iceberg.maintenance.orphans import remove_orphans
    from pipeline_output.stores.postgres import PostgresStore
