"""What a code location's dataset assets learn when the location loads (`build_definitions`).

- Their kinds follow the arm they are written to: the declared mode, else the location's default
  mode (the resource's `default_mode`, else `PIPELINE_OUTPUT_DEFAULT_MODE` for the zero-config
  resource, else `pg`): `iceberg`, `postgres`, both for `dual`; kinds given with `kinds=` stay
  (one naming an arm of a dataset without a mode follows the arm).
- Their definition carries Dagster's table metadata: `dagster/table_name`, and when the Iceberg
  table already exists its `dagster/uri` (the link on the asset page) and `dagster/column_schema`,
  so the catalog shows the columns before the next run (a legacy-arm dataset: the rows table's
  name and URI). That reads the catalog, so it happens only when
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
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.metadata import (
    arm_kinds,
    iceberg_table_metadata,
    iceberg_table_name,
    legacy_table_metadata,
)
from pipeline_output.dagster_layer.resource import PipelineOutputResource
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
        mode = spec.mode or default
        # the arm's kinds replace the declared ones; kinds the user added (`kinds=`) stay
        kinds = (_kinds(asset) - arm_kinds(spec.mode)) | arm_kinds(mode)
        table = _table_metadata(runtime, spec, mode) if runtime is not None else {}

        def change(
            asset_spec: dg.AssetSpec, kinds: set[str] = kinds, table: dict[str, Any] = table
        ) -> dg.AssetSpec:
            changed = asset_spec.replace_attributes(kinds=kinds)
            return changed.merge_attributes(metadata=table) if table else changed

        out.append(asset.map_asset_specs(change))
    return out


def _kinds(asset: dg.AssetsDefinition) -> set[str]:
    return {k for s in asset.specs for k in s.kinds}


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


def _table_metadata(runtime: Runtime, spec: DatasetSpec, mode: str) -> dict[str, Any]:
    """The table metadata of `spec` as its storage is now (nothing on a transient error)."""
    if mode == "pg":
        return legacy_table_metadata(runtime, spec)
    try:
        table = runtime.iceberg.load(spec)
    except RetryableError as exc:
        _log.warning("pipeline-output: %s: table metadata left out at load: %s", spec.name, exc)
        return {}
    if table is None:
        return {"dagster/table_name": iceberg_table_name(runtime, spec)}
    return iceberg_table_metadata(runtime, spec, table)
