"""The `Store` protocol both arms implement, their declared capabilities, the exact attempt marker,
and the publish pipeline that goes through them (one input check, the executed plan reported)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline_output import (
    BadInput,
    DatasetSpec,
    IcebergStore,
    InvalidSpec,
    PostgresStore,
    Window,
    build_definitions,
    dataset,
)
from pipeline_output.contract.spec import Delta
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER, Store
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.ledger import Ledger
from pipeline_output.ledger.window_ledger import WindowLedger
from pipeline_output.services.publish import Publisher, ResolvedMode
from pipeline_output.services.window_apply import ApplyRequest, apply_window
from pipeline_output_tests.oracle import assert_same_multiset

NS = "datasets"
LONG = "a_column_name_longer_than_the_sixty_three_bytes_postgres_allows_x"  # 65 bytes
PROTOCOL_METHODS = ("target_state", "plan", "prepare", "write", "read", "find_marker")


@pytest.fixture
def arms(catalog: Any, pg_db_url: str) -> dict[str, Store]:
    Ledger(pg_db_url).migrate()
    return {
        "iceberg": IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url)),
        "pg": PostgresStore(pg_db_url),
    }


def _publisher(arms: dict[str, Any], pg_db_url: str) -> Publisher:
    return Publisher(iceberg=arms["iceberg"], postgres=arms["pg"], ledger=Ledger(pg_db_url))


def _data_files(warehouse: Path) -> set[Path]:
    return set(warehouse.rglob("*.parquet"))


@pytest.mark.parametrize("store_class", [IcebergStore, PostgresStore], ids=["iceberg", "pg"])
def test_both_arms_implement_every_store_method_with_the_protocol_keywords(
    store_class: Any,
) -> None:
    for name in PROTOCOL_METHODS:
        wanted = inspect.signature(getattr(Store, name)).parameters
        have = inspect.signature(getattr(store_class, name)).parameters
        missing = [p for p in wanted if p not in have]
        assert missing == [], f"{store_class.__name__}.{name} lacks {missing}"
        for p in wanted.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY:
                assert have[p.name].kind is inspect.Parameter.KEYWORD_ONLY, (name, p.name)
    assert store_class.capabilities.arm == store_class.arm


@pytest.mark.parametrize("arm", ["iceberg", "pg"])
def test_find_marker_names_the_commit_that_carries_the_attempt_marker_and_no_other(
    arms: dict[str, Store], arm: str
) -> None:
    store = arms[arm]
    spec = DatasetSpec(name=f"marked_{arm}", primary_key=("id",))
    frame = pl.DataFrame({"id": [1, 2], "v": ["a", "b"]})
    assert store.find_marker(spec, "1:1") is None  # no table, no deploy yet
    first = store.write(spec, frame, summary={ATTEMPT_MARKER: "1:1"})
    second = store.write(spec, frame.with_columns(v=pl.lit("c")), summary={ATTEMPT_MARKER: "1:2"})
    assert first.snapshot_id is not None and second.snapshot_id is not None
    assert store.find_marker(spec, "1:1") == first.snapshot_id
    assert store.find_marker(spec, "1:2") == second.snapshot_id
    assert store.find_marker(spec, "1:3") is None
    # a re-run that changes nothing commits nothing, so its marker is not found either
    noop = store.write(spec, frame.with_columns(v=pl.lit("c")), summary={ATTEMPT_MARKER: "1:4"})
    assert noop.noop and store.find_marker(spec, "1:4") is None


def test_a_rolled_back_legacy_write_leaves_no_marker(arms: dict[str, Any]) -> None:
    pg: PostgresStore = arms["pg"]
    spec = DatasetSpec(name="rolled_back", primary_key=("id",))
    frame = pl.DataFrame({"id": [1], "v": [1]})
    pending = pg.begin_write(spec, frame, summary={ATTEMPT_MARKER: "5:1"})
    pending.rollback()
    assert pg.find_marker(spec, "5:1") is None
    committed = pg.begin_write(spec, frame, summary={ATTEMPT_MARKER: "5:2"}).commit()
    assert pg.find_marker(spec, "5:2") == committed.snapshot_id


def test_a_crashed_legacy_attempt_is_retried_not_repaired_when_another_write_of_its_window_committed(
    arms: dict[str, Any], pg_db_url: str
) -> None:
    """Repair used to guess: any succeeded legacy deploy of the window that finished after the
    attempt started counted as the attempt's own write, so the window was marked applied and the
    compute's rows were never written. The marker is exact: the window is written."""
    pg: PostgresStore = arms["pg"]
    publisher = Publisher(iceberg=arms["iceberg"], postgres=pg, ledger=pg.ledger)
    windows = WindowLedger(pg_db_url)
    spec = DatasetSpec(
        name="crashed",
        primary_key=("id",),
        strategy="replace",
        delta=Delta(source="events", watermark="seq"),
    )
    window = Window(0, 10)
    windows.plan(spec.name, [window])
    with windows.apply_lock(spec.name):  # an attempt starts, then its process dies
        crashed = windows.begin(spec.name, window.to_key(), run_id="dead-run")
    assert crashed.action == "apply"
    # meanwhile someone writes that window through the API, without the attempt's marker
    pg.write(spec, pl.DataFrame({"id": [1], "seq": [1], "v": ["manual"]}), window=window)

    computed = pl.DataFrame({"id": [1, 2, 3], "seq": [1, 5, 10], "v": ["a", "b", "c"]})
    outcome = apply_window(
        ApplyRequest(
            spec=spec,
            window=window,
            compute=lambda: computed,
            mode=ResolvedMode("pg", "run config"),
            run_id="retry",
        ),
        publisher=publisher,
        ledger=windows,
    )
    assert outcome.action == "applied"
    assert_same_multiset(pg.read(spec), computed)
    row = windows.get(spec.name, window.to_key())
    assert row is not None and row.state == "applied"
    assert row.pg_deploy_id == pg.find_marker(spec, row.marker)


def test_a_dual_write_of_a_column_the_legacy_arm_cannot_store_fails_before_any_file_is_written(
    arms: dict[str, Any], pg_db_url: str, catalog_warehouse: str
) -> None:
    publisher = _publisher(arms, pg_db_url)
    spec = DatasetSpec(name="nested_dual", primary_key=("id",), strategy="append_always")
    publisher.publish(
        spec, pl.DataFrame({"id": [1], "tags": ["x"]}), mode=ResolvedMode("dual", "run config")
    )
    warehouse = Path(catalog_warehouse.removeprefix("file://"))
    before = _data_files(warehouse)
    nested = pl.DataFrame({"id": [2], "tags": [["a", "b"]]})
    for call in (publisher.prepare, publisher.publish):
        with pytest.raises(BadInput) as err:
            call(spec, nested, mode=ResolvedMode("dual", "run config"))
        message = str(err.value)
        assert "'nested_dual'" in message and "'tags'" in message
        assert "legacy Postgres arm" in message and "nothing was written" in message
        assert _data_files(warehouse) == before  # not even a pre-written, later deleted file
    assert arms["iceberg"].read(spec).height == 1 and arms["pg"].read(spec).height == 1


def test_the_iceberg_arm_alone_stores_what_the_legacy_arm_cannot(
    arms: dict[str, Any], pg_db_url: str
) -> None:
    publisher = _publisher(arms, pg_db_url)
    spec = DatasetSpec(name="nested_ice", primary_key=("id",))
    frame = pl.DataFrame({"id": [1, 2], "tags": [["a"], []], LONG: [1, 2]})
    for _ in range(2):  # a re-run is a no-op
        result = publisher.publish(spec, frame, mode=ResolvedMode("iceberg", "run config"))
    assert result.primary.noop
    assert_same_multiset(arms["iceberg"].read(spec), frame)
    with pytest.raises(BadInput, match=f"column '{LONG}' is longer than the legacy"):
        arms["pg"].write(spec, frame.drop("tags"))
    assert arms["pg"].target_state(spec).first_deploy  # nothing was written


def test_a_name_too_long_for_the_legacy_arm_fails_at_load_unless_the_dataset_is_iceberg_only() -> (
    None
):
    @dataset(name="long_key_iceberg", primary_key=LONG, mode="iceberg")
    def ok() -> pl.DataFrame:
        return pl.DataFrame({LONG: [1]})

    build_definitions(datasets=[ok])  # loads: it never writes the legacy arm

    @dataset(name="long_key_default", primary_key=LONG)
    def starts_on_the_legacy_arm() -> pl.DataFrame:
        return pl.DataFrame({LONG: [1]})

    with pytest.raises(InvalidSpec) as err:
        build_definitions(datasets=[starts_on_the_legacy_arm])
    message = str(err.value)
    assert "'long_key_default'" in message and LONG in message
    assert "63-byte" in message and "mode='iceberg'" in message


def test_publish_reports_the_plan_it_executed_under_the_lock_not_an_earlier_dry_run(
    arms: dict[str, Any], pg_db_url: str, catalog: Any
) -> None:
    publisher = _publisher(arms, pg_db_url)
    spec = DatasetSpec(name="raced_plan", primary_key=("id",))
    mode = ResolvedMode("dual", "run config")
    dry = publisher.plan(spec, mode=mode)
    assert all(p.first_deploy for p in dry.values())
    # another writer deploys first, between the dry run and this run's write
    other = _publisher(
        {"iceberg": IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url)), "pg": arms["pg"]},
        pg_db_url,
    )
    other.publish(spec, pl.DataFrame({"id": [1], "v": [1]}), mode=mode)
    result = publisher.publish(spec, pl.DataFrame({"id": [1, 2], "v": [1, 2]}), mode=mode)
    for arm in ("iceberg", "pg"):
        executed = result.plans[arm]
        assert executed is result.results[arm].plan
        assert not executed.first_deploy and executed.write_mode == "upsert"
        assert result.results[arm].write_mode == executed.write_mode
