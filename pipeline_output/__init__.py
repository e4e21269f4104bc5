"""pipeline-output: materialise produced datasets into Apache Iceberg with dbt-grade write strategies.

The public Python API, loaded on first use so `import pipeline_output` (and the CLI) stays fast and
the pure core never imports Dagster: the runtime for a control plane and a catalog (`connect` ->
`Runtime`: stores, ledgers, `Publisher`), specs and planning (`DatasetSpec`, `Delta`, `Window`,
`plan_write`), the arms (`IcebergStore`, `PostgresStore`), results and errors, write-audit-publish,
rollback and time travel (`publish_audit`, `drop_stale_audit_branches`, `rollback`, `history`), table
maintenance (`compact`, `expire_snapshots`, `remove_orphans`, `maintain`), and the Dagster layer
(`dataset`, `postgres_source`, `iceberg_source`, `model_node`, `build_definitions`,
`DatasetIOManager`, `PipelineOutputResource`, and `PipelineOutputComponent` for `dg` projects).

Public modules: this package, `pipeline_output.errors` (every deliberate error) and
`pipeline_output.maintenance` (table maintenance). Every other module is internal: its names may
move between releases; import them from here.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from pipeline_output.contract.version import VERSION
from pipeline_output.infra.collector import imports_paused

# The public API, one table: each public module and the names it exports. `__all__` and the lazy
# map below are derived from it; the type-checking imports at the end of this file list the same
# names (pipeline_output_tests/test_public_api.py holds them equal).
_API: dict[str, tuple[str, ...]] = {
    "pipeline_output.errors": (
        *("AuditConflict", "AuditFailed", "BadInput", "DuplicateKeys", "EmptyComputeRefused"),
        *("InvalidSpec", "LockUnavailable", "MaintenanceConflict", "MissingKeyColumn", "NullKey"),
        *("PipelineOutputError", "RollbackRefused", "RowsOutsideWindow", "SchemaMismatch"),
        *("SettingsError", "UnsupportedWrite", "WriteConflict", "ChangesExpired"),
    ),
    # specs, planning, results
    "pipeline_output.contract.spec": ("DatasetSpec", "Delta"),
    "pipeline_output.contract.windows": ("Window",),
    "pipeline_output.contract.plan": ("TargetState", "WritePlan", "WriteResult", "plan_write"),
    # the runtime for a control plane and a catalog, the arms
    "pipeline_output.services.runtime": ("Runtime", "connect"),
    "pipeline_output.services.publish": ("Publisher",),
    "pipeline_output.stores.iceberg": ("IcebergStore",),
    "pipeline_output.stores.postgres": ("PostgresStore",),
    # write-audit-publish, rollback, time travel
    "pipeline_output.services.audit": ("drop_stale_audit_branches", "publish_audit"),
    "pipeline_output.services.time_travel": ("history", "rollback"),
    # incremental downstreams: an upstream's changes since the last run, exactly once
    "pipeline_output.services.incremental": ("DELETED", "Changes"),
    # table maintenance (also `pipeline_output.maintenance`)
    "pipeline_output.maintenance": (
        *("HealthThresholds", "MaintenanceOptions", "compact", "expire_snapshots", "maintain"),
        "remove_orphans",
    ),
    # the Dagster layer
    "pipeline_output.dagster_layer.dataset": ("dataset",),
    "pipeline_output.dagster_layer.source_assets": ("iceberg_source", "postgres_source"),
    "pipeline_output.dagster_layer.model_node": ("model_node",),
    "pipeline_output.dagster_layer.build": ("build_definitions",),
    "pipeline_output.dagster_layer.io_manager": ("DatasetIOManager",),
    "pipeline_output.dagster_layer.resource": ("PipelineOutputResource",),
    "pipeline_output.dagster_layer.component": ("PipelineOutputComponent",),
}
__version__ = VERSION
_EXPORTS = {name: module for module, names in _API.items() for name in names}

__all__ = sorted([*_EXPORTS, "__version__"])


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


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs: the table above, as imports
    # (`X as X`: an explicit re-export under mypy --strict)
    from pipeline_output.contract.plan import (
        TargetState as TargetState,
    )
    from pipeline_output.contract.plan import (
        WritePlan as WritePlan,
    )
    from pipeline_output.contract.plan import (
        WriteResult as WriteResult,
    )
    from pipeline_output.contract.plan import (
        plan_write as plan_write,
    )
    from pipeline_output.contract.spec import (
        DatasetSpec as DatasetSpec,
    )
    from pipeline_output.contract.spec import (
        Delta as Delta,
    )
    from pipeline_output.contract.windows import (
        Window as Window,
    )
    from pipeline_output.dagster_layer.build import (
        build_definitions as build_definitions,
    )
    from pipeline_output.dagster_layer.component import (
        PipelineOutputComponent as PipelineOutputComponent,
    )
    from pipeline_output.dagster_layer.dataset import (
        dataset as dataset,
    )
    from pipeline_output.dagster_layer.io_manager import (
        DatasetIOManager as DatasetIOManager,
    )
    from pipeline_output.dagster_layer.model_node import (
        model_node as model_node,
    )
    from pipeline_output.dagster_layer.resource import (
        PipelineOutputResource as PipelineOutputResource,
    )
    from pipeline_output.dagster_layer.source_assets import (
        iceberg_source as iceberg_source,
    )
    from pipeline_output.dagster_layer.source_assets import (
        postgres_source as postgres_source,
    )
    from pipeline_output.errors import (
        AuditConflict as AuditConflict,
    )
    from pipeline_output.errors import (
        AuditFailed as AuditFailed,
    )
    from pipeline_output.errors import (
        BadInput as BadInput,
    )
    from pipeline_output.errors import (
        ChangesExpired as ChangesExpired,
    )
    from pipeline_output.errors import (
        DuplicateKeys as DuplicateKeys,
    )
    from pipeline_output.errors import (
        EmptyComputeRefused as EmptyComputeRefused,
    )
    from pipeline_output.errors import (
        InvalidSpec as InvalidSpec,
    )
    from pipeline_output.errors import (
        LockUnavailable as LockUnavailable,
    )
    from pipeline_output.errors import (
        MaintenanceConflict as MaintenanceConflict,
    )
    from pipeline_output.errors import (
        MissingKeyColumn as MissingKeyColumn,
    )
    from pipeline_output.errors import (
        NullKey as NullKey,
    )
    from pipeline_output.errors import (
        PipelineOutputError as PipelineOutputError,
    )
    from pipeline_output.errors import (
        RollbackRefused as RollbackRefused,
    )
    from pipeline_output.errors import (
        RowsOutsideWindow as RowsOutsideWindow,
    )
    from pipeline_output.errors import (
        SchemaMismatch as SchemaMismatch,
    )
    from pipeline_output.errors import (
        SettingsError as SettingsError,
    )
    from pipeline_output.errors import (
        UnsupportedWrite as UnsupportedWrite,
    )
    from pipeline_output.errors import (
        WriteConflict as WriteConflict,
    )
    from pipeline_output.maintenance import (
        HealthThresholds as HealthThresholds,
    )
    from pipeline_output.maintenance import (
        MaintenanceOptions as MaintenanceOptions,
    )
    from pipeline_output.maintenance import (
        compact as compact,
    )
    from pipeline_output.maintenance import (
        expire_snapshots as expire_snapshots,
    )
    from pipeline_output.maintenance import (
        maintain as maintain,
    )
    from pipeline_output.maintenance import (
        remove_orphans as remove_orphans,
    )
    from pipeline_output.services.audit import (
        drop_stale_audit_branches as drop_stale_audit_branches,
    )
    from pipeline_output.services.audit import (
        publish_audit as publish_audit,
    )
    from pipeline_output.services.incremental import (
        DELETED as DELETED,
    )
    from pipeline_output.services.incremental import (
        Changes as Changes,
    )
    from pipeline_output.services.publish import (
        Publisher as Publisher,
    )
    from pipeline_output.services.runtime import (
        Runtime as Runtime,
    )
    from pipeline_output.services.runtime import (
        connect as connect,
    )
    from pipeline_output.services.time_travel import (
        history as history,
    )
    from pipeline_output.services.time_travel import (
        rollback as rollback,
    )
    from pipeline_output.stores.iceberg import (
        IcebergStore as IcebergStore,
    )
    from pipeline_output.stores.postgres import (
        PostgresStore as PostgresStore,
    )
