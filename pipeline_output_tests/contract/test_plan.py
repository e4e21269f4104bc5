"""The decision table (`plan_write`) cell by cell, and `DatasetSpec` validation. Pure: no I/O."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline_output import (
    DatasetSpec,
    Delta,
    TargetState,
    Window,
    WritePlan,
    plan_write,
)
from pipeline_output.errors import InvalidSpec, PipelineOutputError, UnsupportedWrite
from pipeline_output_tests.oracle import DECISIONS

STRATEGIES = ["snapshot_replace", "append_always", "append_new", "replace", "sync"]
KEYED = {"snapshot_replace", "append_new", "sync"}

MISSING = TargetState(exists=False, has_snapshot=False)
EXISTS_NO_SNAPSHOT = TargetState(exists=True, has_snapshot=False)
WRITTEN = TargetState(exists=True, has_snapshot=True)

WINDOW = Window(low=10, high=20)


def spec_for(strategy: str, *, delta: bool = True) -> DatasetSpec:
    return DatasetSpec(
        name="customers",
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        delta=Delta(source="raw", watermark="seq") if delta else None,
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("target", [MISSING, EXISTS_NO_SNAPSHOT], ids=["missing", "no-snapshot"])
@pytest.mark.parametrize("window", [None, WINDOW], ids=["no-window", "window"])
def test_first_deploy_is_always_a_replace(strategy, target, window):
    plan = plan_write(spec_for(strategy), target, window)
    assert isinstance(plan, WritePlan)
    assert plan.first_deploy is True
    assert plan.write_mode == "replace"
    assert plan.write_mode == DECISIONS[(strategy, "first_deploy")]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_redeploy_without_window_follows_the_decision_table(strategy):
    plan = plan_write(spec_for(strategy), WRITTEN, None)
    assert plan.first_deploy is False
    assert plan.write_mode == DECISIONS[(strategy, "re_deploy")]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_redeploy_with_window_follows_the_decision_table(strategy):
    plan = plan_write(spec_for(strategy), WRITTEN, WINDOW)
    assert plan.first_deploy is False
    assert plan.write_mode == DECISIONS[(strategy, "window")]
    assert plan.window == WINDOW


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("snapshot_replace", "upsert"),
        ("append_always", "append"),
        ("append_new", "append_new"),
        ("replace", "replace"),
        ("sync", "sync"),
    ],
)
def test_redeploy_write_modes_spelled_out(strategy, expected):
    # The table again, literally, so a change to oracle.DECISIONS cannot mask a plan bug.
    assert plan_write(spec_for(strategy), WRITTEN).write_mode == expected
    assert plan_write(spec_for(strategy), WRITTEN, WINDOW).write_mode == expected


def test_replace_plan_without_keys_is_valid():
    spec = DatasetSpec(name="events", strategy="replace")
    assert plan_write(spec, WRITTEN).write_mode == "replace"
    spec2 = DatasetSpec(name="events", strategy="append_always")
    assert plan_write(spec2, WRITTEN).write_mode == "append"


def test_plan_is_pure_and_deterministic():
    spec = spec_for("sync")
    assert plan_write(spec, WRITTEN, WINDOW) == plan_write(spec, WRITTEN, WINDOW)


def test_window_without_delta_settings_is_refused_before_any_io():
    with pytest.raises(PipelineOutputError) as err:
        plan_write(spec_for("snapshot_replace", delta=False), WRITTEN, WINDOW)
    assert "customers" in str(err.value)
    assert isinstance(err.value, (UnsupportedWrite, InvalidSpec))


# --- DatasetSpec validation -------------------------------------------------------------------


def test_spec_primary_key_string_is_normalised_to_a_tuple():
    spec = DatasetSpec(name="customers", primary_key="id")
    assert spec.primary_key == ("id",)


def test_spec_defaults_to_snapshot_replace():
    assert DatasetSpec(name="customers", primary_key=("id",)).strategy == "snapshot_replace"


def test_spec_is_frozen():
    spec = DatasetSpec(name="customers", primary_key=("id",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def test_unknown_strategy_is_invalid_and_lists_the_valid_ones():
    with pytest.raises(InvalidSpec) as err:
        DatasetSpec(name="customers", primary_key=("id",), strategy="merge")  # type: ignore[arg-type]
    msg = str(err.value)
    assert "merge" in msg
    assert "customers" in msg


@pytest.mark.parametrize("strategy", sorted(KEYED))
def test_keyed_strategy_without_primary_key_is_invalid(strategy):
    with pytest.raises(InvalidSpec) as err:
        DatasetSpec(name="customers", primary_key=(), strategy=strategy)  # type: ignore[arg-type]
    assert "customers" in str(err.value)
    assert strategy in str(err.value)


@pytest.mark.parametrize("strategy", ["append_always", "replace"])
def test_unkeyed_strategies_accept_an_empty_primary_key(strategy):
    spec = DatasetSpec(name="events", primary_key=(), strategy=strategy)  # type: ignore[arg-type]
    assert spec.primary_key == ()


@pytest.mark.parametrize("name", ["1customers", "cust-omers", "cust omers", "", "a.b", "x;drop"])
def test_dataset_name_must_be_an_identifier(name):
    with pytest.raises(InvalidSpec):
        DatasetSpec(name=name, primary_key=("id",))


@pytest.mark.parametrize("col", ["1id", "i d", "id-x", "", 'id"'])
def test_primary_key_columns_must_be_identifiers(col):
    with pytest.raises(InvalidSpec) as err:
        DatasetSpec(name="customers", primary_key=(col,))
    assert "customers" in str(err.value)


def test_delta_watermark_must_be_an_identifier():
    with pytest.raises(InvalidSpec):
        Delta(source="raw", watermark="seq no")


def test_window_bounds_are_validated():
    with pytest.raises(InvalidSpec):
        Window(low=20, high=10)
    with pytest.raises(InvalidSpec):
        Window(low=10, high=10)
    assert Window(low=None, high=5).low is None


def test_window_is_half_open_low_excluded_high_included():
    w = Window(low=10, high=20)
    assert not w.contains_value(10)
    assert w.contains_value(11)
    assert w.contains_value(20)
    assert not w.contains_value(21)
    assert Window(low=None, high=20).contains_value(-5)
