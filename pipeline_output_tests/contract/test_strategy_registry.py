"""The strategy registry (`contract/spec.py`: `WRITE_MODES`, `STRATEGIES`): the docs' table is the
registry's, the properties follow from the entries, and a strategy added to the registry alone is
validated and planned. Pure: no I/O. (That each arm has a handler per write mode, and what an arm
does with a mode it has none for: `stores/both_arms/test_write_mode_handlers.py`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline_output import DatasetSpec, Delta, TargetState, Window, plan_write
from pipeline_output.contract.spec import (
    STRATEGIES,
    WRITE_MODES,
    Decision,
    StrategyDef,
    strategy_table,
)
from pipeline_output.errors import InvalidSpec

CONCEPTS = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"
MISSING = TargetState(exists=False, has_snapshot=False)
WRITTEN = TargetState(exists=True, has_snapshot=True)

# A strategy that reuses existing write modes: registered here alone, for one test at a time.
TOY = StrategyDef(
    "insert_or_refresh",
    re_deploy=Decision("append_new", "none", "insert only new keys"),
    window=Decision("upsert", "none", "upsert the window's rows"),
    partition=Decision("sync", "absent_keys_in_slice", "sync the slice"),
)


def test_docs_concepts_strategy_table_is_the_registrys() -> None:
    # regenerate with: python -c "from pipeline_output.contract.spec import strategy_table as t; print(t())"
    text = CONCEPTS.read_text()
    assert strategy_table() in text, (
        "docs/concepts.md's strategy table differs from the registry; it should read:\n"
        + strategy_table()
    )


def test_keyed_window_scoped_and_lookback_safety_follow_from_the_entries() -> None:
    assert {s.name for s in STRATEGIES.values() if s.keyed} == {
        "snapshot_replace",
        "append_new",
        "sync",
    }
    # a delta window's write covers what it read (lookback included) where it deletes
    assert {s.name for s in STRATEGIES.values() if s.window_scoped} == {"replace", "sync"}
    assert {s.name for s in STRATEGIES.values() if not s.rereads_safely} == {"append_always"}
    assert {m.name for m in WRITE_MODES.values() if m.as_given} == {
        "replace",
        "append",
        "append_new",
    }
    assert {m.name: m.row_level for m in WRITE_MODES.values() if m.row_level} == {
        "replace": "delete",
        "upsert": "merge",
        "sync": "merge",
    }


def test_a_strategy_added_to_the_registry_alone_is_validated_and_planned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(STRATEGIES, TOY.name, TOY)
    with pytest.raises(InvalidSpec, match=r"'toy_unkeyed'.*needs a primary_key"):
        DatasetSpec(name="toy_unkeyed", strategy=TOY.name)  # append_new matches by key
    spec = DatasetSpec(name="toy", primary_key=("id",), strategy=TOY.name)
    first, again = plan_write(spec, MISSING), plan_write(spec, WRITTEN)
    assert (first.write_mode, first.delete_scope) == ("replace", "all")
    assert (again.write_mode, again.delete_scope) == ("append_new", "none")
    assert again.describe() == (
        "append_new (re-deploy): insert only rows whose key is absent from the target; leave others"
    )
    windowed = DatasetSpec(
        name="toy_w",
        primary_key=("id",),
        strategy=TOY.name,
        delta=Delta(source="raw", watermark="seq", lookback=2),  # upsert re-reads safely
    )
    assert plan_write(windowed, WRITTEN, Window(low=1, high=2)).write_mode == "upsert"
    assert plan_write(spec, WRITTEN, partitioned_by=("day",)).write_mode == "sync"


def test_a_registered_strategy_whose_window_appends_refuses_a_lookback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    appends = StrategyDef(
        "toy_appender",
        re_deploy=Decision("append", "none", "append"),
        window=Decision("append", "none", "append"),
        partition=None,  # refused
    )
    monkeypatch.setitem(STRATEGIES, appends.name, appends)
    with pytest.raises(InvalidSpec, match=r"'toy_a'.*toy_appender would append twice"):
        DatasetSpec(
            name="toy_a",
            strategy=appends.name,
            delta=Delta(source="raw", watermark="seq", lookback=1),
        )


def test_a_strategy_naming_an_unregistered_write_mode_cannot_be_built() -> None:
    with pytest.raises(InvalidSpec, match=r"'toy_bad'.*'merge_into' is not one of WRITE_MODES"):
        StrategyDef(
            "toy_bad",
            re_deploy=Decision("merge_into", "none", "?"),
            window=None,
            partition=None,
        )
