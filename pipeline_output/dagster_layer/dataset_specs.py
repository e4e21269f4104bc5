"""Where a dataset asset keeps its `DatasetSpec`: on the asset's compute function and in a
per-process registry, out of the metadata the UI shows (the spec is how the IO manager, the
checks and the CLI know a dataset, not something a user reads).

`@dataset` and `model_node` attach the spec to the function they build (`attach_spec`); every copy
Dagster makes of the asset (hooks, key prefixes, changed attributes) keeps the same op and so the
same function. A run's IO manager finds the spec of an asset (`spec_in_run`) in the first of:

1. the asset's definition in the run's job, else in the job it was subset from (a run of a
   selection), else in the repository the run worker loaded (a job built from another selection);
2. JSON in its definition metadata under `pipeline_output/contract/spec` (`SPEC_METADATA_KEY`): an
   asset a user builds by hand may carry it there;
3. the specs decorated in this process under that asset key: the only one, or the only one whose
   shown metadata (`pipeline_output/...`) matches (an in-process run of a job that leaves the
   upstream dataset out).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec, spec_from_dict
from pipeline_output.dagster_layer.keys import SPEC_METADATA_KEY

_ATTRIBUTE = "__pipeline_output_spec__"
_SHOWN_PREFIX = "pipeline_output/"
_lock = threading.Lock()
_registry: dict[dg.AssetKey, list[tuple[dict[str, str], DatasetSpec]]] = {}


def attach_spec(
    fn: Callable[..., Any],
    spec: DatasetSpec,
    *,
    key: dg.AssetKey | None = None,
    shown: Mapping[str, Any] | None = None,
) -> None:
    """Make `spec` the spec of the asset `key` (default: named `spec.name`, no key prefix) whose
    compute function is `fn`; `shown` is the metadata its definition shows (told apart from
    another spec under that key)."""
    setattr(fn, _ATTRIBUTE, spec)
    entry = (_shown(shown or {}), spec)
    with _lock:
        entries = _registry.setdefault(key or dg.AssetKey(spec.name), [])
        if not any(e[1] == spec and e[0] == entry[0] for e in entries):
            entries.append(entry)


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
    """The spec of the asset `key` as an IO manager `context` sees it, handed the asset's
    definition `metadata` (None: not a pipeline-output dataset). See the module docstring."""
    for graph in _graphs(context):
        if graph.has(key):
            spec = spec_of(graph.get(key).assets_def)
            if spec is not None:
                return spec
    meta = metadata or {}
    raw = meta.get(SPEC_METADATA_KEY)
    if raw is not None:
        return spec_from_metadata(raw)
    with _lock:
        entries = list(_registry.get(key, ()))
    distinct: list[DatasetSpec] = []
    for _, spec in entries:
        if spec not in distinct:
            distinct.append(spec)
    if len(distinct) == 1:
        return distinct[0]
    shown = _shown(meta)
    matching = [spec for seen, spec in entries if seen == shown]
    return matching[0] if len(matching) == 1 else None


def _graphs(context: Any) -> Iterator[Any]:
    """The asset graphs a run step can see: its job's, the jobs it was subset from, the loaded
    repository's."""
    try:
        step = context.step_context
    except (dg.DagsterInvariantViolationError, AttributeError):
        return
    job = step.job_def
    while job is not None:
        yield job.asset_layer.asset_graph
        selection = job.asset_selection_data
        job = selection.parent_job_def if selection is not None else None
    try:
        repository = step.job.get_repository_definition()
    except Exception:  # an in-memory job has none; a broken pointer is not ours to report
        repository = None
    if repository is not None:
        yield repository.asset_graph


def _shown(metadata: Mapping[str, Any]) -> dict[str, str]:
    return {
        k: str(getattr(v, "value", v)) for k, v in metadata.items() if k.startswith(_SHOWN_PREFIX)
    }
