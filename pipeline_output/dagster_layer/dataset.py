"""`@dataset`: turn a compute function into a Dagster asset written by the IO manager.

The function's parameters name its upstream assets (sources, other datasets, or any asset under
the key `ins` gives it), loaded as polars LazyFrames, or as the frame type a parameter's annotation
names (`frames_io.py`); it returns polars, pandas or Arrow. The spec rides on the compute
function, not in the metadata the UI shows (`dataset.py`). Options map 1:1 onto
`DatasetSpec` (validated when the code location loads, with the dataset's name in the message)
plus `deps`, `ins` and Dagster's own asset options (`group`, `description`, `owners`, `tags`,
`pool`, …: `asset_params.AssetOptions`); Dagster partitions (`partitions_def`, `partition_column`) are
`partitioned.py`'s. Every dataset asset takes run config `mode` (override the dataset's mode for this run),
`dry_run` (plan only: report what would be written, write nothing, record no materialisation),
`restate`, `audit` (write-audit-publish for this run: `audit_hooks.py`) and `as_of` (read the
upstream datasets as they were at a time, or at a snapshot: a reproducible re-run). The asset
declares its `parity` and `table_health` checks and evaluates them in its own step, after the
write (`checks.py`).

Where a dataset asset keeps its `DatasetSpec`: on the asset's compute function and in a
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

import functools
import inspect
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Unpack

import dagster as dg

from pipeline_output.contract.checked_input import collect_frame
from pipeline_output.contract.spec import (
    DatasetSpec,
    Delta,
    Mode,
    Strategy,
    WriteStrategyHint,
    spec_from_dict,
)
from pipeline_output.contract.windows import Window
from pipeline_output.dagster_layer.asset_params import (
    AssetOptions,
    AssetOptionsKwargs,
    Upstream,
    asset_options,
    asset_params,
    define_asset,
    remember_build,
    upstream_ins,
)
from pipeline_output.dagster_layer.changes_assets import (
    CHANGES_OF_KEY,
    ChangesOutput,
    ChangesSource,
    changes_param,
    mark_changes_input,
)
from pipeline_output.dagster_layer.checks import declared_checks, evaluate_checks
from pipeline_output.dagster_layer.compute_context import CONTEXT_PARAMETER, ComputeContext
from pipeline_output.dagster_layer.failures import failing_as_dagster
from pipeline_output.dagster_layer.frames_io import (
    FrameKind,
    as_kind,
    check_output,
    convert_inputs,
    input_kinds,
    typed_inputs,
)
from pipeline_output.dagster_layer.keys import (
    AUDIT_OVERRIDE_KEY,
    IO_MANAGER_KEY,
    MODE_OVERRIDE_KEY,
    SPEC_METADATA_KEY,
)
from pipeline_output.dagster_layer.metadata import (
    CODE_REFERENCES_KEY,
    arm_kinds,
    code_reference,
    definition_metadata,
    docstring_columns,
)
from pipeline_output.dagster_layer.partitioned import (
    KEY_PARAMETER,
    PARTITION_COLUMNS_KEY,
    partition_columns_of,
    partitioned_output,
    run_keys,
    slice_for,
)
from pipeline_output.dagster_layer.resource import RESOURCE_KEY
from pipeline_output.errors import InvalidSpec
from pipeline_output.services.incremental import check_downstream

if TYPE_CHECKING:
    from pipeline_output.dagster_layer.delta_assets import WindowedOutput

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


def define_dataset_asset(
    compute: Callable[..., Any],
    spec: DatasetSpec,
    *,
    key: dg.AssetKey,
    label: str,
    metadata: dict[str, Any],
    **params: Any,
) -> dg.AssetsDefinition:
    """The asset `key` that writes `spec` (a `@dataset` or a `model_node`): the spec rides on
    `compute`, out of sight (`attach_spec`); it declares the dataset's own checks, shows
    `metadata` and is written by this code location's IO manager with its resource. `params`:
    the rest of `asset_params.define_asset`'s."""
    attach_spec(compute, spec, key=key, shown=metadata)
    return define_asset(
        compute,
        key=key,
        label=label,
        check_specs=declared_checks(spec, key),
        io_manager_key=IO_MANAGER_KEY,
        required_resource_keys={RESOURCE_KEY},
        metadata=metadata,
        **params,
    )


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


__all__ = ["DatasetRunConfig", "build_dataset_asset", "dataset", "spec_from_metadata", "spec_of"]


class DatasetRunConfig(dg.Config):
    """Run config of every dataset asset (settable in the launchpad or by a sensor)."""

    mode: str | None = None
    dry_run: bool = False
    restate: bool = False
    # write-audit-publish for this run (None: the dataset's own `audit`)
    audit: bool | None = None
    # read upstream datasets as they were: an ISO-8601 time with a zone, or a snapshot id
    as_of: str | None = None


def dataset(
    name: str | None = None,
    *,
    primary_key: str | Sequence[str] = (),
    strategy: Strategy = "snapshot_replace",
    mode: Mode | None = None,
    delta: Delta | None = None,
    partition_by: Sequence[str] | None = None,
    sort_by: Sequence[str] = (),
    dedupe_by: str | None = None,
    allow_empty: bool = False,
    write_strategy_hint: WriteStrategyHint = "auto",
    audit: bool = False,
    columns: Mapping[str, str] | None = None,
    deps: Sequence[Any] | None = None,
    partitions_def: dg.PartitionsDefinition[Any] | None = None,
    partition_column: str | Mapping[str, str] | None = None,
    ins: Mapping[str, Upstream] | None = None,
    **options: Unpack[AssetOptionsKwargs],
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """Decorate `def name(upstream: pl.LazyFrame, ...) -> pl.DataFrame | pl.LazyFrame` (inputs
    and output may also be pandas or Arrow: `frames_io.py`). `columns` describes columns
    (`{"total": "quantity times unit price"}`), on top of a `Columns:` section of the docstring.

    `partitions_def` + `partition_column`: Dagster's own partitions, each a slice of the table
    (`partitioned.py`; the compute takes `partition_key: str`, or `context` as a Dagster asset
    does — each key's call sees its key: `compute_context.py`); `ins`: upstream asset keys per
    parameter; `deps`: upstream assets not read; `options`: Dagster's own asset options
    (`group`, `description` — default the docstring —, `key_prefix`, `pool`, …:
    `asset_params.AssetOptions`)."""
    given = asset_options("dataset", **options)

    def decorate(fn: Callable[..., Any]) -> dg.AssetsDefinition:
        ds_name = name or fn.__name__
        doc = given.description or inspect.getdoc(fn)
        described = {**docstring_columns(inspect.getdoc(fn)), **dict(columns or {})}
        try:
            spec = DatasetSpec(
                name=ds_name,
                primary_key=tuple([primary_key] if isinstance(primary_key, str) else primary_key),
                strategy=strategy,
                mode=mode,
                delta=delta,
                partition_by=None if partition_by is None else tuple(partition_by),
                sort_by=tuple(sort_by),
                dedupe_by=dedupe_by,
                allow_empty=allow_empty,
                description=doc,
                write_strategy_hint=write_strategy_hint,
                audit=audit,
                columns=tuple(described.items()),
            )
        except InvalidSpec as exc:  # one line, naming where the dataset is declared
            cause = str(exc).removeprefix(f"dataset {ds_name!r}: ")
            raise InvalidSpec(f"@dataset {ds_name!r} ({fn.__module__}): {cause}") from None
        by_partition = partition_columns_of(spec, partitions_def, partition_column)

        def build(chosen: AssetOptions) -> dg.AssetsDefinition:
            return build_dataset_asset(
                spec,
                fn,
                options=chosen,
                deps=deps,
                partitions_def=partitions_def,
                partition_columns=by_partition,
                ins=ins,
            )

        own = replace(given, description=doc)  # the docstring is the dataset's own description
        asset = build(own)
        remember_build(asset, own, build)
        return asset

    return decorate


def build_dataset_asset(
    spec: DatasetSpec,
    fn: Callable[..., Any],
    *,
    options: AssetOptions | None = None,
    deps: Sequence[Any] | None = None,
    partitions_def: dg.PartitionsDefinition[Any] | None = None,
    extra_metadata: Mapping[str, Any] | None = None,
    partition_columns: Mapping[str, str] | None = None,
    ins: Mapping[str, Upstream] | None = None,
) -> dg.AssetsDefinition:
    """The Dagster asset for `spec` computed by `fn`, with Dagster's own `options`
    (`asset_params.asset_params`)."""
    params = [p for p in inspect.signature(fn).parameters.values()]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise InvalidSpec(
                f"@dataset {spec.name!r}: *args/**kwargs are not allowed; name each upstream asset"
            )
    takes_context = CONTEXT_PARAMETER in (p.name for p in params)
    upstream = [
        p.name
        for p in params
        if p.name != CONTEXT_PARAMETER
        and not (partition_columns is not None and p.name == KEY_PARAMETER)
    ]
    delta_param = spec.delta.source if spec.delta is not None else None
    if delta_param is not None and delta_param not in upstream:
        raise InvalidSpec(
            f"@dataset {spec.name!r}: Delta(source={delta_param!r}) must name one of the "
            f"function's parameters {upstream}"
        )
    if spec.delta is not None and partitions_def is None:
        from pipeline_output.dagster_layer.delta_assets import window_partitions

        partitions_def = window_partitions(spec)
    frame_kinds = input_kinds(fn, dataset=spec.name, params=upstream)
    changes_of = changes_param(frame_kinds, dataset=spec.name)
    if changes_of is not None and (partition_columns is not None or spec.delta is not None):
        raise InvalidSpec(
            f"@dataset {spec.name!r}: a Changes input cannot be combined with Dagster partitions "
            "or a Delta: the changes since the last run are the increment"
        )

    def write(
        context: dg.AssetExecutionContext, config: DatasetRunConfig, inputs: dict[str, Any]
    ) -> dg.Output[Any]:
        given = fn
        if takes_context and partition_columns is None:  # else each key's call gets its own
            given = functools.partial(fn, **{CONTEXT_PARAMETER: ComputeContext(context)})
        call = _Call(spec, given, inputs, frame_kinds)
        out: Any
        if delta_param is not None:
            out = _windowed_output(context, call, delta_param, restate=config.restate)
        elif changes_of is not None:
            out = _changes_output(call, changes_of)
        elif partition_columns is not None:
            typed = typed_inputs(fn, frame_kinds)
            out = partitioned_output(context, spec, typed, inputs, columns=partition_columns)
        else:
            out = call()
        return dg.Output(out, metadata=_overrides(config))

    def body(
        context: dg.AssetExecutionContext, config: DatasetRunConfig, **inputs: Any
    ) -> Iterator[Any]:
        if context.selected_asset_keys:  # else a run of its checks alone: nothing is written
            if config.dry_run:  # nothing written: nothing to check
                yield from _dry_run(context, spec, config, partition_columns)
                return
            yield write(context, config, inputs)  # the IO manager writes before this resumes
        yield from evaluate_checks(context, spec)

    sig_params = [
        inspect.Parameter(
            "context", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dg.AssetExecutionContext
        ),
        inspect.Parameter(
            "config", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=DatasetRunConfig
        ),
        *[inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in upstream],
    ]

    def compute(
        context: dg.AssetExecutionContext, config: DatasetRunConfig, *args: Any, **kwargs: Any
    ) -> Iterator[Any]:
        inputs = dict(zip(upstream, args, strict=False))
        inputs.update(kwargs)
        with failing_as_dagster(spec.name):
            yield from body(context, config, **inputs)

    compute.__signature__ = inspect.Signature(sig_params)  # type: ignore[attr-defined]
    compute.__name__ = spec.name
    label = f"@dataset {spec.name!r}"
    options = options or AssetOptions()
    passed = asset_params(
        options,
        label=label,
        kinds=arm_kinds(spec.mode),
        # a backfill of Dagster partitions or of delta windows is one run over the range
        partitioned=partition_columns is not None or spec.delta is not None,
    )
    all_metadata: dict[str, Any] = {**passed.pop("metadata", {}), **definition_metadata(spec)}
    if partition_columns is not None:
        all_metadata[PARTITION_COLUMNS_KEY] = json.dumps(dict(partition_columns))
    all_metadata.update(extra_metadata or {})
    if CODE_REFERENCES_KEY not in all_metadata and (where := code_reference(fn)) is not None:
        all_metadata[CODE_REFERENCES_KEY] = where  # Dagster adds the Component's defs.yaml after
    key = options.key(spec.name)
    asset_ins = upstream_ins(spec, upstream, ins)
    if changes_of is not None:
        upstream_name = mark_changes_input(asset_ins, changes_of, dataset=spec.name)
        check_downstream(spec, upstream_name)
        all_metadata[CHANGES_OF_KEY] = upstream_name
    return define_dataset_asset(
        compute,
        spec,
        key=key,
        label=label,
        metadata=all_metadata,
        ins=asset_ins,
        deps=list(deps) if deps else None,
        partitions_def=partitions_def,
        **passed,
    )


@dataclass(frozen=True)
class _Call:
    """One run's call of the user's function `fn`: its `inputs` as loaded, each converted to its
    parameter's kind (`kinds`) when called; its output checked (`check_output`)."""

    spec: DatasetSpec
    fn: Callable[..., Any]
    inputs: Mapping[str, Any]
    kinds: Mapping[str, FrameKind]

    def __call__(self) -> Any:
        """The output from every input."""
        return self._checked(self.fn(**convert_inputs(self.inputs, self.kinds)))

    def given(self, param: str) -> Callable[[Any], Any]:
        """The output as a function of `param`'s value (a window's read, the changes), the other
        inputs converted once, now."""
        others = convert_inputs({k: v for k, v in self.inputs.items() if k != param}, self.kinds)
        return lambda value: self._checked(self.fn(**{param: value}, **others))

    def _checked(self, out: Any) -> Any:
        check_output(self.spec.name, out)
        return out


def _windowed_output(
    context: dg.AssetExecutionContext, call: _Call, param: str, *, restate: bool
) -> WindowedOutput:
    """Per window: a thunk computing that window's rows from the windowed source read."""
    from pipeline_output.dagster_layer.delta_assets import WindowedOutput
    from pipeline_output.dagster_layer.resource import runtime_of
    from pipeline_output.dagster_layer.windows_context import windows_of
    from pipeline_output.services.window_planning import window_scopes

    spec = call.spec
    assert spec.delta is not None
    windows = windows_of(context, spec)
    if not windows:
        raise dg.Failure(
            f"dataset {spec.name!r} is a delta dataset: materialise it for window partitions "
            "(planned by its sensor), not unpartitioned"
        )
    reader, kind = call.inputs[param], call.kinds[param]
    compute = call.given(param)
    lookback = spec.delta.lookback
    keys = [w.to_key() for w in windows]
    ledger = runtime_of(context).windows
    ledger_rows = ledger.around(spec.name, keys, before=lookback) if lookback else []
    items = []
    for window, read_window, write_window in window_scopes(spec, windows, ledger_rows):

        def thunk(rw: Window = read_window, window: Window = window) -> Any:
            try:
                computed = compute(as_kind(reader.scan(rw), kind))
            except Exception as exc:  # which of a range's windows, its type and message kept
                exc.add_note(f"(computing window {window} of dataset {spec.name!r})")
                raise
            out = collect_frame(spec, computed)
            reader.check_read(rw, dataset=spec.name)  # the read happened at the collect: check it
            return out

        items.append((window, thunk, write_window))
    return WindowedOutput(tuple(items), restate=restate)


def _changes_output(call: _Call, param: str) -> ChangesOutput:
    """An incremental downstream's output: its compute, called by the IO manager with the
    changes it reads under the downstream's lock (`changes_assets.py`)."""
    source = call.inputs[param]
    if not isinstance(source, ChangesSource):
        raise dg.Failure(
            f"dataset {call.spec.name!r}: its Changes input {param!r} was not loaded by "
            "pipeline-output's IO manager (an upstream dataset's changes come from its table)"
        )
    return ChangesOutput(source.upstream, call.given(param), source.columns)


def _overrides(config: DatasetRunConfig) -> dict[str, Any]:
    """This run's overrides, handed to the IO manager as output metadata."""
    meta: dict[str, Any] = {MODE_OVERRIDE_KEY: config.mode} if config.mode else {}
    if config.audit is not None:
        meta[AUDIT_OVERRIDE_KEY] = config.audit
    return meta


def _dry_run(
    context: dg.AssetExecutionContext,
    spec: DatasetSpec,
    config: DatasetRunConfig,
    partition_columns: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """Plan only: log and observe what a write would do; no output, so no materialisation."""
    from pipeline_output.dagster_layer.resource import runtime_of
    from pipeline_output.dagster_layer.windows_context import windows_of

    publisher = runtime_of(context).publisher
    resolved = publisher.resolve(spec, override=config.mode)
    scopes: list[dict[str, Any]] = [{"window": w} for w in windows_of(context, spec)]
    if partition_columns is not None:
        defn = context.assets_def.partitions_def
        keys = run_keys(context, defn)
        scopes = [{"partition": slice_for(defn, partition_columns, k)} for k in keys]
    for scope in scopes or [{}]:
        window, part = scope.get("window"), scope.get("partition")
        plans = publisher.plan(spec, mode=resolved, window=window, partition=part)
        for arm, plan in plans.items():
            state = "first deploy (no committed write)" if plan.first_deploy else "re-deploy"
            text = f"[dry run] {spec.name} ({arm}): {plan.describe()}; target: {state}"
            context.log.info(text)
            yield dg.AssetObservation(
                asset_key=context.asset_key,
                partition=window.to_key() if window is not None else part and part.key,
                metadata={
                    "dry_run": True,
                    "arm": arm,
                    "mode": f"{resolved.mode} (from {resolved.source})",
                    "write_mode": plan.write_mode,
                    "reason": plan.reason,
                    "target_state": state,
                    "expected_effect": plan.describe(),
                },
            )
