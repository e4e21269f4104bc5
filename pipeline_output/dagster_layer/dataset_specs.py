"""Where a dataset asset keeps its `DatasetSpec`: on the asset's compute function, out of the
metadata the UI shows (the spec is how the IO manager, the checks and the CLI know a dataset, not
something a user reads).

`@dataset` and `model_node` attach the spec to the function they build (`attach_spec`); every copy
Dagster makes of the asset (hooks, key prefixes, changed attributes) keeps the same op and so the
same function. An asset a user builds by hand may still carry the spec as JSON in its definition
metadata under `pipeline_output/contract/spec` (`SPEC_METADATA_KEY`): `spec_of` reads both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec, spec_from_dict
from pipeline_output.dagster_layer.keys import SPEC_METADATA_KEY

_ATTRIBUTE = "__pipeline_output_spec__"


def attach_spec(fn: Callable[..., Any], spec: DatasetSpec) -> None:
    """Make `spec` the spec of the asset whose compute function is `fn`."""
    setattr(fn, _ATTRIBUTE, spec)


def spec_from_metadata(raw: Any) -> DatasetSpec:
    """Decode the spec from metadata (a JSON string or a Dagster JSON/Text metadata value)."""
    value = getattr(raw, "value", raw)
    if isinstance(value, str):
        value = json.loads(value)
    return spec_from_dict(value)


def spec_of(asset: Any) -> DatasetSpec | None:
    """The `DatasetSpec` of a dataset asset (None for other assets and definitions)."""
    if not isinstance(asset, dg.AssetsDefinition):
        return None
    node = asset.node_def if asset.is_executable else None
    compute = getattr(getattr(node, "compute_fn", None), "decorated_fn", None)
    attached = getattr(compute, _ATTRIBUTE, None)
    if isinstance(attached, DatasetSpec):
        return attached
    for key in asset.keys:
        raw = asset.metadata_by_key.get(key, {}).get(SPEC_METADATA_KEY)
        if raw is not None:
            return spec_from_metadata(raw)
    return None


def spec_in_run(context: Any, key: dg.AssetKey, metadata: Any) -> DatasetSpec | None:
    """The spec of the asset `key` as an IO manager context sees it: from the run's asset graph
    (the asset definition), else from the definition `metadata` it was handed (a context built
    outside a run, or an asset carrying the spec as metadata)."""
    try:
        graph = context.step_context.job_def.asset_layer.asset_graph
    except (dg.DagsterInvariantViolationError, AttributeError):
        graph = None
    if graph is not None and graph.has(key):
        spec = spec_of(graph.get(key).assets_def)
        if spec is not None:
            return spec
    raw = (metadata or {}).get(SPEC_METADATA_KEY)
    return spec_from_metadata(raw) if raw is not None else None
