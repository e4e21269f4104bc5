"""Dagster's own asset options are one object (`AssetOptions`, issue 43): every field is accepted
by `@dataset`, `model_node`, `postgres_source`, `iceberg_source` and the Component's
`asset_options:` (its `defs.yaml` schema), and reaches the built asset definition — a new option
is a field of the object and reaches all four, which this test checks field by field without
naming any builder's parameters. `pool` (Dagster's concurrency pool) is one of them. The
Component's options are defaults: an asset's own option wins, tags are merged, and a key prefix
moves the reads among its assets with them.
"""

from __future__ import annotations

import inspect
import textwrap
import warnings
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from pipeline_output import (
    PipelineOutputComponent,
    dataset,
    iceberg_source,
    model_node,
    postgres_source,
)
from pipeline_output.dagster_layer.asset_params import AssetOptions, AssetOptionsKwargs

# one value per option, as Python passes it ...
VALUES: dict[str, Any] = {
    "group": "shop",
    "description": "described by the options",
    "owners": ["team:data"],
    "tags": {"tier": "gold"},
    "metadata": {"team": "finance"},
    "kinds": ["dbt"],
    "key_prefix": ["px"],
    "automation_condition": dg.AutomationCondition.eager(),
    "freshness_policy": dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=24)),
    "retry_policy": dg.RetryPolicy(max_retries=3, delay=1),
    "backfill_policy": dg.BackfillPolicy.multi_run(max_partitions_per_run=2),
    "code_version": "v7",
    "pool": "warehouse",
}
# ... and as `defs.yaml` spells it (the same value when not given here)
IN_YAML: dict[str, Any] = {
    "automation_condition": "{{ dg.AutomationCondition.eager() }}",
    "freshness_policy": (
        "{{ dg.FreshnessPolicy.time_window(fail_window=datetime.timedelta(hours=24)) }}"
    ),
    "retry_policy": {"max_retries": 3, "delay": 1},
    "backfill_policy": {"type": "multi_run", "max_partitions_per_run": 2},
}


def _spec(asset: dg.AssetsDefinition) -> dg.AssetSpec:
    return asset.specs_by_key[asset.key]


def _shown(value: Any) -> Any:
    return getattr(value, "value", value)


# where each option shows on the built asset definition
REACHED: dict[str, Any] = {
    "group": lambda a, v: _spec(a).group_name == v,
    "description": lambda a, v: _spec(a).description == v,
    "owners": lambda a, v: list(_spec(a).owners) == v,
    "tags": lambda a, v: v.items() <= dict(_spec(a).tags).items(),
    "metadata": lambda a, v: all(_shown(_spec(a).metadata.get(k)) == x for k, x in v.items()),
    "kinds": lambda a, v: set(v) <= _spec(a).kinds,
    "key_prefix": lambda a, v: list(a.key.path[:-1]) == v,
    "automation_condition": lambda a, v: _spec(a).automation_condition == v,
    "freshness_policy": lambda a, v: _spec(a).freshness_policy == v,
    "retry_policy": lambda a, v: a.op.retry_policy == v,
    "backfill_policy": lambda a, v: a.backfill_policy == v,
    "code_version": lambda a, v: _spec(a).code_version == v,
    "pool": lambda a, v: a.op.pool == v,
}
OPTIONS = [f.name for f in fields(AssetOptions)]


def _missed(asset: dg.AssetsDefinition) -> list[str]:
    return [name for name in OPTIONS if not REACHED[name](asset, VALUES[name])]


def test_the_options_object_the_keyword_arguments_and_this_test_name_the_same_options() -> None:
    assert set(AssetOptionsKwargs.__annotations__) == set(OPTIONS)
    assert set(VALUES) == set(REACHED) == set(OPTIONS)


def _builds(**options: Any) -> dict[str, dg.AssetsDefinition]:
    """One asset of each builder, each given `options`."""

    @dataset(primary_key="id", mode="iceberg", **options)
    def orders(events: pl.LazyFrame) -> pl.LazyFrame:
        return events

    def predict(frame: pl.DataFrame) -> pl.DataFrame:
        return frame

    return {
        "dataset": orders,
        "model_node": model_node("scores", source=orders, predict=predict, **options),
        "postgres_source": postgres_source("events", table="events", **options),
        "iceberg_source": iceberg_source("ice", identifier="ns.ice", **options),
    }


def test_every_option_given_to_each_builder_reaches_its_asset_definition() -> None:
    built = _builds(**VALUES)
    assert {name: _missed(asset) for name, asset in built.items()} == {name: [] for name in built}


def test_a_keyword_that_is_no_option_is_refused_naming_the_builder() -> None:
    with pytest.raises(TypeError, match=r"postgres_source\(\) got an unexpected keyword .*'pol'"):
        postgres_source("events", table="events", pol="warehouse")  # type: ignore[call-arg]


def test_a_datasets_source_code_reference_is_its_compute_and_a_model_nodes_its_predict() -> None:
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]

        @dataset(primary_key="k")
        def orders() -> pl.DataFrame:
            return pl.DataFrame({"k": [1]})

    assert not [w for w in warned if "CodeReference" in str(w.message)]  # no beta warning

    refs = orders.metadata_by_key[dg.AssetKey("orders")]["dagster/code_references"]
    assert [(r.file_path, r.line_number) for r in refs.code_references] == [(__file__, line)]

    def predict(frame: pl.DataFrame) -> pl.DataFrame:
        return frame

    scores = model_node("scores", source=orders, predict=predict)
    refs = scores.metadata_by_key[dg.AssetKey("scores")]["dagster/code_references"]
    assert [(r.file_path, r.line_number) for r in refs.code_references] == [
        (__file__, predict.__code__.co_firstlineno)
    ]


def test_an_option_spelled_as_dagster_spells_it_is_answered_with_ours_and_its_line() -> None:
    with pytest.raises(TypeError) as refused:

        @dataset(primary_key="k", group_name="shop")  # type: ignore[call-arg]
        def orders() -> pl.DataFrame:
            return pl.DataFrame({"k": [1]})

    message = str(refused.value)
    assert "dataset() got an unexpected keyword argument 'group_name'" in message
    assert f"({__file__}:" in message  # the user's line, not pipeline-output's
    assert message.endswith("Dagster's group_name is group= here")


MODULE = '''
    import polars as pl

    from pipeline_output import dataset, iceberg_source, model_node, postgres_source

    events = postgres_source("events", table="events")
    ice = iceberg_source("ice", identifier="ns.ice")


    @dataset(primary_key="id", mode="iceberg")
    def orders(events: pl.LazyFrame) -> pl.LazyFrame:
        return events


    def predict(frame: pl.DataFrame) -> pl.DataFrame:
        return frame


    scores = model_node("scores", source=orders, predict=predict)


    @dataset(
        primary_key="id", mode="iceberg", group="own", tags={"tier": "own"}, metadata={"note": "mine"}
    )
    def own(ice: pl.LazyFrame) -> pl.LazyFrame:
        """Documented by its docstring."""
        return ice
'''


@pytest.fixture
def component_defs(env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    """The Component over a module that gives its assets no option, with every option in
    `asset_options:` as `defs.yaml` spells it."""
    (tmp_path / "optioned_shop.py").write_text(textwrap.dedent(MODULE).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    attributes = {name: IN_YAML.get(name, VALUES[name]) for name in OPTIONS}
    component = PipelineOutputComponent.resolve_from_dict(
        {"module": "optioned_shop", "asset_options": attributes}
    )
    return dg.component_defs(component=component)


def test_the_components_schema_takes_every_option() -> None:
    schema = PipelineOutputComponent.model().model_json_schema()
    assert set(schema["$defs"]["AssetOptionsModel"]["properties"]) == set(OPTIONS)


def test_every_option_of_the_component_reaches_each_asset_it_serves(
    component_defs: dg.Definitions,
) -> None:
    served = {
        name: component_defs.get_assets_def(dg.AssetKey(["px", name]))
        for name in ("orders", "scores", "events", "ice")
    }
    assert {name: _missed(asset) for name, asset in served.items()} == {name: [] for name in served}
    graph = component_defs.resolve_asset_graph()
    px = dg.AssetKey
    assert graph.get(px(["px", "orders"])).parent_keys == {px(["px", "events"])}
    assert graph.get(px(["px", "scores"])).parent_keys == {px(["px", "orders"])}


def test_an_assets_own_options_win_over_the_components(component_defs: dg.Definitions) -> None:
    own = _spec(component_defs.get_assets_def(dg.AssetKey(["px", "own"])))
    assert own.group_name == "own"
    assert own.description == "Documented by its docstring."
    assert own.tags["tier"] == "own"
    # metadata merged: the Component's beside the asset's own
    assert (_shown(own.metadata["note"]), _shown(own.metadata["team"])) == ("mine", "finance")
