"""Dagster's own asset parameters on `@dataset`, and upstream assets under any key.

Owns what `@dataset` hands to `dg.asset` beyond the dataset itself: the pass-through parameters
(`automation_condition`, `freshness_policy`, `retry_policy`, `code_version`, `backfill_policy`,
`key_prefix`, `kinds` added to the arm's (`iceberg`, `postgres` or both: `metadata.arm_kinds`),
`metadata` beside the dataset's own), the default single-run backfill policy of a Dagster-partitioned dataset, the `ins` mapping of compute
parameters to upstream asset keys (`AssetIn`, `AssetKey`, a string or a list of strings), and the
conversion of what an upstream's own IO manager loads (polars, pandas, Arrow) into the LazyFrame
the compute receives. A misconfiguration fails when the code location loads, in one line naming
the dataset (`InvalidSpec`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.keys import DELTA_INPUT_KEY
from pipeline_output.dagster_layer.metadata import arm_kinds
from pipeline_output.errors import InvalidSpec

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


def asset_params(
    spec: DatasetSpec,
    *,
    partitioned: bool,
    kinds: Sequence[str] | None,
    metadata: Mapping[str, Any] | None,
    backfill_policy: dg.BackfillPolicy | None,
    **passed: Any,
) -> dict[str, Any]:
    """The keyword arguments `@dataset` passes to `dg.asset` besides the compute and the IO
    manager: every pass-through parameter given (None ones left out), kinds, user metadata and,
    for a Dagster-partitioned or delta dataset, a single-run backfill policy unless one is given."""
    reserved = sorted(k for k in metadata or {} if str(k).startswith(RESERVED_METADATA_PREFIX))
    if reserved:
        raise InvalidSpec(
            f"@dataset {spec.name!r}: metadata keys {reserved} use the reserved prefix "
            f"{RESERVED_METADATA_PREFIX!r}"
        )
    if kinds is not None and (isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds)):
        raise InvalidSpec(f"@dataset {spec.name!r}: kinds must be a list of strings, got {kinds!r}")
    out = {k: v for k, v in passed.items() if v is not None}
    out["kinds"] = arm_kinds(spec.mode) | set(kinds or ())
    if backfill_policy is not None:
        out["backfill_policy"] = backfill_policy
    elif partitioned:
        out["backfill_policy"] = dg.BackfillPolicy.single_run()
        out[_DEFAULTED] = True  # Dagster's beta notice is not the user's to read
    return out


_DEFAULTED = "__po_backfill_defaulted__"


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
    spec: DatasetSpec,
    compute: Callable[..., Any],
    *,
    key: dg.AssetKey,
    check_specs: Sequence[dg.AssetCheckSpec] = (),
    **params: Any,
) -> dg.AssetsDefinition:
    """The asset `key` computed by `compute`: `dg.asset(**params)` as a one-asset `multi_asset`
    that declares `check_specs` and can be subset (a run may select the asset without some of
    its checks, or only checks: `checks.py`); the op is named as `dg.asset` names it
    and its one output (`result`) is optional. Dagster's own refusal of a parameter (a freshness
    policy of the wrong kind, say) is one line naming the dataset."""
    quiet = params.pop(_DEFAULTED, False)
    params.pop("name", None)
    params.pop("key_prefix", None)
    described = {k: params.pop(k) for k in _ASSET_OUT_PARAMS if params.get(k) is not None}
    try:
        with warnings.catch_warnings():
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
    except (dg.DagsterInvalidDefinitionError, dg.DagsterInvariantViolationError) as exc:
        raise InvalidSpec(f"@dataset {spec.name!r}: {_one_line(exc)}") from exc
    except Exception as exc:  # dagster's parameter checks (`CheckError`)
        if not any(c.__name__ == "CheckError" for c in type(exc).__mro__):
            raise
        raise InvalidSpec(f"@dataset {spec.name!r}: {_one_line(exc)}") from exc


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
