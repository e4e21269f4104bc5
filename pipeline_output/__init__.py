"""pipeline-output: materialise produced datasets into Apache Iceberg with dbt-grade write strategies.

The public Python API. The pure core (specs, planning, windows, stores) imports no Dagster; the
Dagster layer lives in `pipeline_output.defs`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from pipeline_output.errors import (
    BadInput,
    DuplicateKeys,
    EmptyComputeRefused,
    InvalidSpec,
    LockUnavailable,
    MissingKeyColumn,
    NullKey,
    PipelineOutputError,
    RowsOutsideWindow,
    SchemaMismatch,
    SettingsError,
    UnsupportedWrite,
    WriteConflict,
)
from pipeline_output.plan import TargetState, WritePlan, plan_write
from pipeline_output.result import WriteResult
from pipeline_output.spec import DatasetSpec, Delta
from pipeline_output.stores.iceberg import IcebergStore
from pipeline_output.windows import Window

_DAGSTER_EXPORTS = {
    "dataset": "pipeline_output.defs.dataset",
    "postgres_source": "pipeline_output.defs.sources",
    "iceberg_source": "pipeline_output.defs.sources",
    "build_definitions": "pipeline_output.defs.build",
    "DatasetIOManager": "pipeline_output.defs.io_manager",
}


def __getattr__(name: str) -> object:
    """Dagster-layer names load on first use, so the core imports no Dagster."""
    module = _DAGSTER_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline_output' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "BadInput",
    "DatasetIOManager",
    "DatasetSpec",
    "Delta",
    "DuplicateKeys",
    "EmptyComputeRefused",
    "IcebergStore",
    "InvalidSpec",
    "LockUnavailable",
    "MissingKeyColumn",
    "NullKey",
    "PipelineOutputError",
    "RowsOutsideWindow",
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
    "dataset",
    "iceberg_source",
    "plan_write",
    "postgres_source",
]
