"""What a code location's dataset assets learn when the location loads (`build_definitions`).

- Their kinds follow the arm they are written to: the declared mode, else the location's default
  mode (the resource's `default_mode`, else `PIPELINE_OUTPUT_DEFAULT_MODE` for the zero-config
  resource, else `pg`): `iceberg`, `postgres`, both for `dual`.
- Their definition carries `dagster/column_schema` when the Iceberg table already exists, so the
  catalog shows the columns before the next run. That reads the catalog, so it happens only when
  Dagster loads the location to serve it (a code server, `dg check defs`, `dg list defs`: the load
  context says INITIALIZATION), never on a plain import nor in a run worker's reconstruction
  (which needs no display metadata). An unreachable control plane or catalog leaves the schema
  out and logs a warning (the location still loads); a malformed configuration fails the load.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import dagster as dg
from dagster._core.definitions.definitions_load_context import (
    DefinitionsLoadContext,
    DefinitionsLoadType,
)

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.dataset_specs import spec_of
from pipeline_output.dagster_layer.resource import PipelineOutputResource
from pipeline_output.dagster_layer.table_metadata import arm_kinds, column_schema
from pipeline_output.errors import RetryableError
from pipeline_output.services.runtime import Runtime

_log = logging.getLogger(__name__)


def at_load(assets: Sequence[Any], resource: PipelineOutputResource) -> list[Any]:
    """`assets` with each dataset's kinds by its arm and, when its table exists, its columns."""
    default = location_default_mode(resource)
    runtime = _runtime_at_load(resource)
    out: list[Any] = []
    for asset in assets:
        spec = spec_of(asset)
        if spec is None:
            out.append(asset)
            continue
        kinds = arm_kinds(spec.mode or default)
        schema = _existing_schema(runtime, spec) if runtime is not None else None

        def change(
            asset_spec: dg.AssetSpec, kinds: set[str] = kinds, schema: Any = schema
        ) -> dg.AssetSpec:
            changed = asset_spec.replace_attributes(kinds=kinds)
            if schema is not None:
                changed = changed.merge_attributes(metadata={"dagster/column_schema": schema})
            return changed

        out.append(asset.map_asset_specs(change))
    return out


def location_default_mode(resource: PipelineOutputResource) -> str:
    """The mode of a dataset declared without one, in this location."""
    if resource.default_mode is not None:
        return resource.default_mode
    if resource.configured:
        return "pg"
    from pipeline_output.errors import SettingsError
    from pipeline_output.infra.settings import default_mode

    try:
        return default_mode()
    except SettingsError:
        return "pg"  # the runtime reports the bad variable when it is built


def _runtime_at_load(resource: PipelineOutputResource) -> Runtime | None:
    """The location's runtime when Dagster loads it to serve it; else None."""
    if not DefinitionsLoadContext.is_set():
        return None
    if DefinitionsLoadContext.get().load_type != DefinitionsLoadType.INITIALIZATION:
        return None
    try:
        return resource.runtime()
    except RetryableError as exc:
        _log.warning("pipeline-output: column schemas left out at load: %s", exc)
        return None


def _existing_schema(runtime: Runtime, spec: DatasetSpec) -> dg.TableSchema | None:
    try:
        table = runtime.iceberg.load(spec)
    except RetryableError as exc:
        _log.warning("pipeline-output: %s: column schema left out at load: %s", spec.name, exc)
        return None
    return column_schema(table.schema(), spec) if table is not None else None
