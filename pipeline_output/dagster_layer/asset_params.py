"""Dagster's own asset options on every asset pipeline-output builds, and upstream assets under any key.

`AssetOptions` is the one definition of the Dagster options `@dataset`, `model_node`,
`postgres_source`/`iceberg_source` and the `PipelineOutputComponent` (`asset_options:`, defaults
for the assets it serves) all take: `group`, `description`, `owners`, `tags`, `metadata` (beside
the asset's own), `kinds` (added to the asset's own: the arm's, `metadata.arm_kinds`, or the
source's kind), `key_prefix`, `automation_condition`, `freshness_policy`, `retry_policy`,
`backfill_policy`, `code_version` and `pool` (Dagster's concurrency pool). The builders take them
as keyword arguments (`AssetOptionsKwargs`) and apply them with one function (`asset_params`); a
new option is a field of `AssetOptions` and a key of `AssetOptionsKwargs`, here, and reaches all
four (`test_asset_options.py`). A Dagster-partitioned or delta dataset backfills in one run unless
`backfill_policy` says otherwise.

Also owned here: building the asset (`define_asset`, a subsettable one-asset `multi_asset`;
`define_observation`, an observable source), the `ins` mapping of compute parameters to upstream
asset keys (`AssetIn`, `AssetKey`, a string or a list of strings), and the conversion of what an
upstream's own IO manager loads (polars, pandas, Arrow) into the LazyFrame the compute receives.
A misconfiguration fails when the code location loads, in one line naming the asset
(`InvalidSpec`).
"""

# no `from __future__ import annotations`: the Component reads `AssetOptions`' annotations as types

import inspect
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal, TypedDict, Unpack

import dagster as dg
import polars as pl
from dagster._core.definitions.assets.definition.asset_spec import (
    AssetExecutionType,  # what an observable asset is (not exported by dagster)
)

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.keys import DELTA_INPUT_KEY
from pipeline_output.errors import InvalidSpec, UnknownOption


class AssetOptionsKwargs(TypedDict, total=False):
    """`AssetOptions` as the keyword arguments of `@dataset`, `model_node` and the sources."""

    group: str | None
    description: str | None
    owners: Sequence[str] | None
    tags: Mapping[str, str] | None
    metadata: Mapping[str, Any] | None
    kinds: Sequence[str] | None
    key_prefix: str | Sequence[str] | None
    automation_condition: dg.AutomationCondition[Any] | None
    freshness_policy: dg.FreshnessPolicy | None
    retry_policy: dg.RetryPolicy | None
    backfill_policy: dg.BackfillPolicy | None
    code_version: str | None
    pool: str | None


class RetryPolicyAttributes(dg.Model):
    """`retry_policy:` in `defs.yaml` (Dagster's `RetryPolicy`)."""

    max_retries: int = 1
    delay: float | None = None
    backoff: Literal["LINEAR", "EXPONENTIAL"] | None = None
    jitter: Literal["FULL", "PLUS_MINUS"] | None = None


def _retry_policy(context: dg.ResolutionContext, raw: Any) -> dg.RetryPolicy | None:
    value = context.resolve_value(raw)
    if value is None or isinstance(value, dg.RetryPolicy):
        return value
    given = value if isinstance(value, RetryPolicyAttributes) else RetryPolicyAttributes(**value)
    return dg.RetryPolicy(
        max_retries=given.max_retries,
        delay=given.delay,
        backoff=dg.Backoff[given.backoff] if given.backoff else None,
        jitter=dg.Jitter[given.jitter] if given.jitter else None,
    )


class BackfillPolicyAttributes(dg.Model):
    """`backfill_policy:` in `defs.yaml`: one run for a range, or runs of at most N partitions."""

    type: Literal["single_run", "multi_run"] = "single_run"
    max_partitions_per_run: int = 1


def _backfill_policy(context: dg.ResolutionContext, raw: Any) -> dg.BackfillPolicy | None:
    value = context.resolve_value(raw)
    if value is None or isinstance(value, dg.BackfillPolicy):
        return value
    given = (
        value if isinstance(value, BackfillPolicyAttributes) else BackfillPolicyAttributes(**value)
    )
    if given.type == "single_run":
        return dg.BackfillPolicy.single_run()
    return dg.BackfillPolicy.multi_run(max_partitions_per_run=given.max_partitions_per_run)


# in `defs.yaml`, an object-valued option is a template: "{{ dg.AutomationCondition.eager() }}"
_TEMPLATE = dg.Resolver.default(model_field_type=str | None)


@dataclass(frozen=True, kw_only=True)
class AssetOptions(dg.Resolvable):
    """Dagster's own options of an asset pipeline-output builds (None: not given). Each passes
    to Dagster under its own name (`group` as `group_name`); see the module docstring."""

    group: str | None = None
    description: str | None = None
    owners: Sequence[str] | None = None
    tags: Mapping[str, str] | None = None
    metadata: Mapping[str, Any] | None = None
    kinds: Sequence[str] | None = None
    key_prefix: str | Sequence[str] | None = None
    automation_condition: Annotated[dg.AutomationCondition[Any] | None, _TEMPLATE] = None
    freshness_policy: Annotated[dg.FreshnessPolicy | None, _TEMPLATE] = None
    retry_policy: Annotated[
        dg.RetryPolicy | None,
        dg.Resolver(_retry_policy, model_field_type=RetryPolicyAttributes | None),
    ] = None
    backfill_policy: Annotated[
        dg.BackfillPolicy | None,
        dg.Resolver(_backfill_policy, model_field_type=BackfillPolicyAttributes | None),
    ] = None
    code_version: str | None = None
    pool: str | None = None

    def over(self, defaults: "AssetOptions") -> "AssetOptions":
        """These options, with `defaults` for the ones not given (`tags` and `metadata` merged,
        these keys winning)."""
        merged: dict[str, Any] = {}
        for f in fields(self):
            own, default = getattr(self, f.name), getattr(defaults, f.name)
            if isinstance(own, Mapping) and isinstance(default, Mapping):
                merged[f.name] = {**default, **own}
            else:
                merged[f.name] = default if own is None else own
        return AssetOptions(**merged)

    def key(self, name: str) -> dg.AssetKey:
        """The key of the asset `name` under these options: `[*key_prefix, name]`."""
        prefix = self.key_prefix
        if prefix is None:
            return dg.AssetKey(name)
        return dg.AssetKey([*([prefix] if isinstance(prefix, str) else prefix), name])


def asset_options(caller: str, /, **options: Unpack[AssetOptionsKwargs]) -> AssetOptions:
    """The options `caller` (`dataset`, …) was given; another keyword is `UnknownOption` (a
    `TypeError`, as Python raises for it)."""
    unknown = sorted(set(options) - {f.name for f in fields(AssetOptions)})
    if unknown:
        hint = _OTHER_NAMES.get(unknown[0])
        raise UnknownOption(
            f"{caller}() got an unexpected keyword argument {unknown[0]!r}{_called_at()}"
            + (f": {hint}" if hint else "")
        )
    return AssetOptions(**options)


# Dagster's names where they differ from ours
_DAGSTER_NAMES = {"group": "group_name"}

# `dg.asset`'s keywords a Dagster user reaches for, answered with what they are here
_OTHER_NAMES = {
    **{theirs: f"Dagster's {theirs} is {ours}= here" for ours, theirs in _DAGSTER_NAMES.items()},
    "compute_kind": "use kinds=[...] (Dagster's successor of compute_kind)",
    "key": "the key is the name (name=, default the function's) under key_prefix=",
    "io_manager_key": "pipeline-output writes the dataset itself; there is no IO manager to choose",
    "io_manager_def": "pipeline-output writes the dataset itself; there is no IO manager to choose",
    "config_schema": "a dataset's run config is its own (as_of, audit, dry_run, mode, restate)",
}


def _called_at() -> str:
    """` (file:line)` of the first caller outside pipeline-output: where the keyword was written
    (a one-line error from the CLI has no traceback to show it)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame = frame.f_back
    if frame is None:
        return ""
    return f" ({frame.f_code.co_filename}:{frame.f_lineno})"


def asset_params(
    options: AssetOptions, *, label: str, kinds: set[str], partitioned: bool = False
) -> dict[str, Any]:
    """The keyword arguments `options` give `dg.asset` (`define_asset`, `define_observation`):
    every option given, under Dagster's name (`key_prefix` is the key's: `AssetOptions.key`);
    `kinds` the asset's own plus the given ones; for a `partitioned` asset (Dagster partitions or
    delta windows) a single-run backfill policy unless one is given. `label` names the asset in
    the one-line error of a misconfiguration (`@dataset 'orders'`)."""
    metadata = options.metadata or {}
    reserved = sorted(k for k in metadata if str(k).startswith(RESERVED_METADATA_PREFIX))
    if reserved:
        raise InvalidSpec(
            f"{label}: metadata keys {reserved} use the reserved prefix "
            f"{RESERVED_METADATA_PREFIX!r}"
        )
    given = options.kinds
    if given is not None and (isinstance(given, str) or not all(isinstance(k, str) for k in given)):
        raise InvalidSpec(f"{label}: kinds must be a list of strings, got {given!r}")
    out: dict[str, Any] = {}
    for f in fields(options):
        value = getattr(options, f.name)
        if value is not None and f.name != "key_prefix":
            out[_DAGSTER_NAMES.get(f.name, f.name)] = value
    out["kinds"] = kinds | set(given or ())
    if options.backfill_policy is None and partitioned:
        out["backfill_policy"] = dg.BackfillPolicy.single_run()
        out[_DEFAULTED] = True  # Dagster's beta notice is not the user's to read
    return out


_DEFAULTED = "__po_backfill_defaulted__"
_BUILT = "__pipeline_output_built__"


def remember_build(asset: Any, options: AssetOptions, build: Callable[[AssetOptions], Any]) -> None:
    """Keep on `asset` (this very object, not the copies Dagster makes of it) the options it was
    built with and how to build it again with others (`with_defaults`)."""
    setattr(asset, _BUILT, (options, build))


def with_defaults(asset: Any, defaults: AssetOptions) -> Any:
    """`asset` built again with `defaults` for the options it was not given; an asset not built
    by pipeline-output (or a copy Dagster made of one) is returned as it is."""
    built = getattr(asset, _BUILT, None)
    if built is None:
        return asset
    options, build = built
    return build(options.over(defaults))


# what `dg.asset` takes that describes the asset (the rest describes its op)
_ASSET_OUT_PARAMS = (
    "description",
    "io_manager_key",
    "metadata",
    "group_name",
    "code_version",
    "automation_condition",
    "owners",
    "tags",
    "kinds",
    "freshness_policy",
)


def define_asset(
    compute: Callable[..., Any],
    *,
    key: dg.AssetKey,
    label: str,
    check_specs: Sequence[dg.AssetCheckSpec] = (),
    **params: Any,
) -> dg.AssetsDefinition:
    """The asset `key` computed by `compute`: `dg.asset(**params)` as a one-asset `multi_asset`
    that declares `check_specs` and can be subset (a run may select the asset without some of
    its checks, or only checks: `checks.py`); the op is named as `dg.asset` names it
    and its one output (`result`) is optional. Dagster's own refusal of a parameter (a freshness
    policy of the wrong kind, say) is one line naming the asset (`label`)."""
    quiet = params.pop(_DEFAULTED, False)
    params.pop("name", None)
    described = {k: params.pop(k) for k in _ASSET_OUT_PARAMS if params.get(k) is not None}
    with _refused(label), warnings.catch_warnings():
        if quiet:
            warnings.filterwarnings("ignore", ".*backfill_policy.*", dg.BetaWarning)
        out = dg.AssetOut(key=key, is_required=False, **described)
        asset: dg.AssetsDefinition = dg.multi_asset(
            outs={"result": out},
            name=key.to_python_identifier(),
            description=described.get("description"),
            can_subset=True,
            check_specs=list(check_specs),
            **{k: v for k, v in params.items() if v is not None},
        )(compute)
    return asset


def define_observation(
    observe: Callable[[dg.AssetExecutionContext], dg.ObserveResult],
    *,
    key: dg.AssetKey,
    label: str,
    io_manager_key: str,
    required_resource_keys: set[str],
    **params: Any,
) -> dg.AssetsDefinition:
    """The observable asset `key` (a source): `observe(context)` returns its `dg.ObserveResult`;
    `params` as `define_asset` takes them, the asset's on its spec, the op's on its op (`pool`,
    `retry_policy`), loaded downstream through `io_manager_key`."""
    params.pop(_DEFAULTED, None)
    described = {k: params.pop(k) for k in _ASSET_OUT_PARAMS if params.get(k) is not None}
    backfill_policy = params.pop("backfill_policy", None)

    def body(context: dg.AssetExecutionContext) -> dg.ObserveResult:
        return observe(context)

    with _refused(label), warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # `execution_type`: Dagster's own use
        op = dg.op(
            name=key.to_python_identifier(),
            description=described.get("description"),
            out={"result": dg.Out(io_manager_key=io_manager_key)},
            required_resource_keys=required_resource_keys,
            **params,
        )(body)
        return dg.AssetsDefinition(
            keys_by_output_name={"result": key},
            node_def=op,
            specs=[dg.AssetSpec(key, **described)],
            execution_type=AssetExecutionType.OBSERVATION,
            backfill_policy=backfill_policy,
        )


@contextmanager
def _refused(label: str) -> Iterator[None]:
    """Dagster's refusal of a parameter as one `InvalidSpec` line naming the asset."""
    try:
        yield
    except (dg.DagsterInvalidDefinitionError, dg.DagsterInvariantViolationError) as exc:
        raise InvalidSpec(f"{label}: {_one_line(exc)}") from exc
    except Exception as exc:  # dagster's parameter checks (`CheckError`)
        if not any(c.__name__ == "CheckError" for c in type(exc).__mro__):
            raise
        raise InvalidSpec(f"{label}: {_one_line(exc)}") from exc


RESERVED_METADATA_PREFIX = "pipeline_output/"

Upstream = dg.AssetIn | dg.AssetKey | str | Sequence[str]


def upstream_ins(
    spec: DatasetSpec, params: Sequence[str], ins: Mapping[str, Upstream] | None
) -> dict[str, dg.AssetIn]:
    """One `AssetIn` per compute parameter: the asset named like it, or the key `ins` gives it
    (the delta source's input carries the watermark for the IO manager either way)."""
    given = dict(ins or {})
    unknown = sorted(set(given) - set(params))
    if unknown:
        raise InvalidSpec(
            f"@dataset {spec.name!r}: ins names {unknown}, which are not parameters of the "
            f"compute {list(params)}"
        )
    delta_param = spec.delta.source if spec.delta is not None else None
    out = {}
    for name in params:
        asset_in = _as_asset_in(spec, name, given.get(name, name))
        if name == delta_param:
            assert spec.delta is not None
            asset_in = asset_in._replace(
                metadata={**(asset_in.metadata or {}), DELTA_INPUT_KEY: spec.delta.watermark}
            )
        if spec.delta is not None and asset_in.partition_mapping is None:
            # a window reads the whole upstream through its own predicate, whatever windows
            # (partitions) a delta upstream has: a chained delta dataset's keys are its own
            asset_in = asset_in._replace(partition_mapping=dg.AllPartitionMapping())
        out[name] = asset_in
    return out


def _as_asset_in(spec: DatasetSpec, name: str, value: Any) -> dg.AssetIn:
    if isinstance(value, dg.AssetIn):
        if value.key is not None:
            return value
        key = dg.AssetKey([*(value.key_prefix or []), name])  # `AssetIn(key_prefix=...)`
        return value._replace(key=key, key_prefix=None)
    if isinstance(value, dg.AssetKey):
        return dg.AssetIn(key=value)
    if isinstance(value, str):
        return dg.AssetIn(key=dg.AssetKey.from_user_string(value))
    if isinstance(value, Sequence) and value and all(isinstance(p, str) for p in value):
        return dg.AssetIn(key=dg.AssetKey(list(value)))
    raise InvalidSpec(
        f"@dataset {spec.name!r}: ins[{name!r}] must be a dg.AssetIn, a dg.AssetKey, a key "
        f"string or a list of strings, got {value!r}"
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def as_lazy(value: Any) -> Any:
    """What an upstream's IO manager loaded, as the LazyFrame the compute receives: polars
    frames, pandas DataFrames and Arrow tables are converted; anything else is passed as is."""
    if isinstance(value, pl.DataFrame):
        return value.lazy()
    if isinstance(value, pl.LazyFrame):
        return value
    module = type(value).__module__.split(".")[0]
    if module == "pyarrow" and hasattr(value, "schema"):
        frame = pl.from_arrow(value)
        return frame.lazy() if isinstance(frame, pl.DataFrame) else frame.to_frame().lazy()
    if module == "pandas" and hasattr(value, "columns"):
        return pl.from_pandas(value).lazy()
    return value


def check_unique_names(assets: Sequence[Any], spec_of: Callable[[Any], Any]) -> None:
    """Two datasets may not share a name under different key prefixes: the name is the Iceberg
    table's and the ledger's (refused when the code location loads)."""
    seen: dict[str, str] = {}
    for asset in assets:
        spec = spec_of(asset) if isinstance(asset, dg.AssetsDefinition) else None
        if spec is None:
            continue
        key = asset.key.to_user_string()
        if spec.name in seen and seen[spec.name] != key:
            raise InvalidSpec(
                f"datasets {seen[spec.name]!r} and {key!r} share the name {spec.name!r}: the "
                "name (not the key prefix) names the Iceberg table and the ledger's records; "
                "rename one"
            )
        seen[spec.name] = key
