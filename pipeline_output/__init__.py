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

__all__ = [
    "BadInput",
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
    "plan_write",
]
