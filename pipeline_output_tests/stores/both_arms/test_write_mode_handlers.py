"""Each arm's handlers of the registry's write modes (`merge.WRITE_HANDLERS`,
`staging.WRITE_HANDLERS`), declared in its capabilities (`Capabilities.write_modes`): every
registered mode has a handler on both arms; a strategy added to the registry alone writes on both;
a write mode an arm has no handler for fails when the code location loads (naming the dataset) and,
written anyway, is one `UnsupportedWrite` on either arm with nothing written (before: the legacy
arm fell through to an upsert, the Iceberg arm raised `KeyError`); the deploy log takes any mode
(no CHECK of its own to migrate)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import polars as pl
import pytest

from pipeline_output import DatasetSpec, build_definitions, dataset
from pipeline_output.contract.spec import (
    STRATEGIES,
    WRITE_MODES,
    Decision,
    StrategyDef,
    WriteModeDef,
)
from pipeline_output.contract.store_protocol import check_specs
from pipeline_output.errors import InvalidSpec, UnsupportedWrite
from pipeline_output.ledger import Ledger
from pipeline_output.stores.iceberg.write import merge
from pipeline_output.stores.postgres import staging
from pipeline_output_tests.iceberg_harness import base, customers, redeploy_rows
from pipeline_output_tests.oracle import assert_same_multiset

ARM_HANDLERS = {
    "iceberg": (merge.ICEBERG_CAPABILITIES, merge.WRITE_HANDLERS),
    "pg": (staging.LEGACY_CAPABILITIES, staging.WRITE_HANDLERS),
}
# a strategy reusing existing write modes (its only site: this registry entry)
INSERT_OR_REFRESH = StrategyDef(
    "insert_or_refresh",
    re_deploy=Decision("append_new", "none", "insert only new keys"),
    window=Decision("upsert", "none", "upsert the window's rows"),
    partition=Decision("sync", "absent_keys_in_slice", "sync the slice"),
)
# a write mode registered in the contract with no handler on either arm
MERGE_INTO = WriteModeDef("merge_into", effect="merge", slice_effect="merge into {}", keyed=True)


@pytest.fixture
def toy_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`insert_or_refresh`; the mode `merge_into` and the strategies `merges` (re-deploys with it)
    and `merges_first` (even its first deploy) — registered for one test."""
    monkeypatch.setitem(STRATEGIES, INSERT_OR_REFRESH.name, INSERT_OR_REFRESH)
    monkeypatch.setitem(WRITE_MODES, MERGE_INTO.name, MERGE_INTO)
    merge_into = Decision("merge_into", "none", "merge")
    merges = StrategyDef("merges", re_deploy=merge_into, window=merge_into, partition=merge_into)
    monkeypatch.setitem(STRATEGIES, merges.name, merges)
    first = StrategyDef(
        "merges_first", first_deploy=merge_into, re_deploy=merge_into, window=None, partition=None
    )
    monkeypatch.setitem(STRATEGIES, first.name, first)
    yield


@pytest.mark.parametrize("arm_name", sorted(ARM_HANDLERS))
def test_every_registered_write_mode_has_a_handler_the_arm_declares(arm_name: str) -> None:
    capabilities, handlers = ARM_HANDLERS[arm_name]
    assert capabilities.write_modes == frozenset(handlers)
    assert set(WRITE_MODES) <= capabilities.write_modes
    for strategy in STRATEGIES.values():
        assert strategy.write_modes <= capabilities.write_modes, strategy.name


def test_a_strategy_added_to_the_registry_alone_writes_on_both_arms(h, arm, toy_registry) -> None:
    spec = DatasetSpec(name="toy_refresh", primary_key=("id",), strategy=INSERT_OR_REFRESH.name)
    check_specs([spec], {a: c for a, (c, _) in ARM_HANDLERS.items()})  # loads on both arms
    first = h.write(spec, base())
    assert (first.write_mode, first.rows_inserted) == ("replace", 40)
    again = h.write(spec, redeploy_rows(), run_id="r2")  # 21..40 known, 41..60 new
    assert (again.write_mode, again.rows_inserted, again.rows_skipped) == ("append_new", 20, 20)
    assert_same_multiset(h.rows(spec), pl.concat([base(), customers(range(41, 61))]))


@pytest.mark.parametrize("strategy", ["merges", "merges_first"])
def test_a_write_mode_the_arm_has_no_handler_for_is_one_unsupported_write(
    h, arm, toy_registry, strategy: str
) -> None:
    spec = DatasetSpec(name="toy_merges", primary_key=("id",), strategy=strategy)
    if strategy == "merges":
        h.write(spec, base())  # its first deploy is a replace
    before = h.footprint(spec)
    with pytest.raises(UnsupportedWrite) as err:
        h.write(spec, redeploy_rows(), run_id="r2")
    message = str(err.value)
    assert "\n" not in message
    assert "'toy_merges'" in message and "'merge_into'" in message
    assert ARM_HANDLERS[arm][0].label in message and "nothing was written" in message
    assert h.footprint(spec) == before  # no upsert in its place, no table, no file


def test_a_strategy_whose_write_mode_an_arm_lacks_fails_at_load_naming_the_dataset(
    toy_registry,
) -> None:
    @dataset(name="toy_loaded", primary_key="id", strategy="merges")
    def toy_loaded() -> pl.DataFrame:
        return pl.DataFrame({"id": [1]})

    with pytest.raises(InvalidSpec) as err:
        build_definitions(datasets=[toy_loaded])
    message = str(err.value)
    assert "\n" not in message
    assert "'toy_loaded'" in message and "'merge_into'" in message
    assert "legacy Postgres arm" in message  # the first arm it would be written to
    # an Iceberg arm with a handler: an iceberg-only dataset loads, one starting on pg does not
    iceberg = dataclasses.replace(
        merge.ICEBERG_CAPABILITIES,
        write_modes=merge.ICEBERG_CAPABILITIES.write_modes | {"merge_into"},
    )
    arms = {"iceberg": iceberg, "pg": staging.LEGACY_CAPABILITIES}
    check_specs(
        [DatasetSpec(name="ice", primary_key="id", strategy="merges", mode="iceberg")], arms
    )
    with pytest.raises(InvalidSpec, match=r"'both'.*'merge_into' \(re_deploy\).*mode='iceberg'"):
        check_specs([DatasetSpec(name="both", primary_key="id", strategy="merges")], arms)


def test_the_deploy_log_records_a_write_mode_added_to_the_registry(pg_db_url: str) -> None:
    ledger = Ledger(pg_db_url)
    ledger.migrate()
    record = ledger.deploy_log.record_deploy(
        "toy_logged", "iceberg", status="succeeded", strategy="merges", write_mode="merge_into"
    )
    assert record.write_mode == "merge_into"  # no CHECK on the ledger's side: the arms refuse
