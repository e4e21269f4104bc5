"""An incremental downstream through Dagster: a `@dataset` parameter annotated `Changes` receives
the upstream's changes since its last run; a per-customer aggregate recomputed for the changed
customers only equals its full recompute after every run (a customer with no order left is
deleted); a re-run without an upstream commit writes nothing; the metadata names the range and
the counts; a killed run (between the downstream's commit and the ledger record) is repaired by
the next run without consuming the range twice; an upstream on the legacy arm is refused when the
location loads."""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl
import pytest

from pipeline_output import DELETED, Changes, build_definitions, dataset
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.errors import InvalidSpec
from pipeline_output.stores.iceberg.snapshot.commit import CHANGE_FILE
from pipeline_output.stores.iceberg.table.changes import read_changes
from pipeline_output_tests.dagster_runs import mat_meta, run_assets
from pipeline_output_tests.oracle import assert_same_multiset

ORDERS: dict[str, pl.DataFrame] = {}
SEEN: list[Changes] = []


def _defs(
    upstream_mode: str | None = "iceberg", ins: dict[str, Any] | None = None
) -> dg.Definitions:
    @dataset(primary_key="order_id", mode=upstream_mode)  # type: ignore[arg-type]
    def orders() -> pl.DataFrame:
        return ORDERS["now"]

    @dataset(primary_key="customer", strategy="sync", mode="iceberg", ins=ins)
    def customer_totals(orders: Changes) -> pl.DataFrame:
        SEEN.append(orders)
        assert orders.current is not None
        changed = orders.keys("customer")
        now = (
            orders.current.join(changed.lazy(), on="customer", how="semi")
            .group_by("customer")
            .agg(pl.col("amount").sum().alias("total"), pl.len().cast(pl.Int64).alias("n"))
        )
        return orders.with_deletions(now, "customer")

    return build_definitions(
        datasets=[orders, customer_totals], with_maintenance=False, with_parity_checks=False
    )


def _recompute(orders: pl.DataFrame) -> pl.DataFrame:
    return orders.group_by("customer").agg(
        pl.col("amount").sum().alias("total"), pl.len().cast(pl.Int64).alias("n")
    )


def _stored(name: str) -> pl.DataFrame:
    return get_runtime().iceberg.read(name)


def _orders(rows: list[tuple[int, str, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"order_id": pl.Int64, "customer": pl.String, "amount": pl.Int64}, orient="row"
    )


def test_changes_input_recomputes_changed_keys_and_deletes_emptied_ones(env: str) -> None:
    SEEN.clear()
    defs = _defs()
    with dg.DagsterInstance.ephemeral() as instance:
        # an upsert upstream keeps unmatched rows: the oracle is the upstream's own table
        ORDERS["now"] = _orders([(1, "ann", 10), (2, "bob", 5), (3, "bob", 7)])
        first = run_assets(defs, instance, ["orders", "customer_totals"])
        meta = mat_meta(first, "customer_totals")
        assert meta["pipeline_output/changes_full_refresh"] is True
        assert meta["pipeline_output/changes_insert"] == 3
        assert_same_multiset(_stored("customer_totals"), _recompute(_stored("orders")))

        # update ann's order, add carl's; bob untouched: only ann and carl are recomputed
        ORDERS["now"] = _orders([(1, "ann", 11), (4, "carl", 3)])
        second = run_assets(defs, instance, ["orders", "customer_totals"])
        meta = mat_meta(second, "customer_totals")
        assert meta["pipeline_output/changes_full_refresh"] is False
        assert (
            meta["pipeline_output/changes_insert"],
            meta["pipeline_output/changes_update_after"],
        ) == (1, 1)
        assert meta["pipeline_output/changes_from_snapshot"] == str(SEEN[0].to_snapshot)
        assert set(SEEN[-1].keys("customer").get_column("customer")) == {"ann", "carl"}
        assert_same_multiset(_stored("customer_totals"), _recompute(_stored("orders")))

        # nothing committed upstream since: the downstream writes and records nothing
        before = get_runtime().iceberg.load("customer_totals").current_snapshot().snapshot_id  # type: ignore[union-attr]
        third = run_assets(defs, instance, ["customer_totals"])
        assert mat_meta(third, "customer_totals")["pipeline_output/changes_action"] == "noop"
        after = get_runtime().iceberg.load("customer_totals").current_snapshot().snapshot_id  # type: ignore[union-attr]
        assert after == before

    # bob's orders are all deleted upstream (a replace of the upstream): bob disappears
    ORDERS["now"] = _orders([(1, "ann", 11), (4, "carl", 3)])
    runtime = get_runtime()
    spec = next(s for s in [_spec(defs, "orders")] if s is not None)
    runtime.publisher.publish(
        _replace_strategy(spec), ORDERS["now"], mode=runtime.publisher.resolve(spec)
    )
    with dg.DagsterInstance.ephemeral() as instance:
        fourth = run_assets(defs, instance, ["customer_totals"])
    assert mat_meta(fourth, "customer_totals")["pipeline_output/changes_delete"] == 2
    stored = _stored("customer_totals")
    assert "bob" not in stored.get_column("customer").to_list()
    assert DELETED not in stored.columns
    assert_same_multiset(stored, _recompute(_stored("orders")))
    history = runtime.ledger.consumed_log.history("customer_totals")
    assert [r.from_snapshot for r in history[1:]] == [r.to_snapshot for r in history[:-1]]


def test_a_run_killed_after_its_commit_is_repaired_not_consumed_twice(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline_output.services import incremental

    SEEN.clear()
    defs = _defs()
    ORDERS["now"] = _orders([(1, "ann", 10), (2, "bob", 5)])
    with dg.DagsterInstance.ephemeral() as instance:
        run_assets(defs, instance, ["orders", "customer_totals"])
        ORDERS["now"] = _orders([(1, "ann", 20)])
        run_assets(defs, instance, ["orders"])

        real = incremental.consume_changes

        def killed(request: Any, **kw: Any) -> Any:
            def boom() -> None:
                raise KeyboardInterrupt("killed between the commit and the ledger record")

            return real(request, **{**kw, "on_written": boom})

        monkeypatch.setattr("pipeline_output.dagster_layer.io_manager.consume_changes", killed)
        with pytest.raises(KeyboardInterrupt):
            run_assets(defs, instance, ["customer_totals"])
        log = get_runtime().ledger.consumed_log
        assert len(log.history("customer_totals")) == 1  # the ledger is behind the commit
        monkeypatch.setattr("pipeline_output.dagster_layer.io_manager.consume_changes", real)
        retry = run_assets(defs, instance, ["customer_totals"])
    meta = mat_meta(retry, "customer_totals")
    assert meta["pipeline_output/changes_action"] == "noop"
    assert meta["pipeline_output/changes_repaired"] is True
    history = log.history("customer_totals")
    assert len(history) == 2 and history[1].downstream_snapshot is not None
    assert_same_multiset(_stored("customer_totals"), _recompute(_stored("orders")))


def test_a_first_run_killed_after_its_commit_keeps_its_range_through_an_expiry(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger knows nothing of a first run killed between its commit and its record, but the
    range it noted before reading keeps its `to` through an expiry: the next run repairs the
    record and reads on from there — not the whole upstream again."""
    from datetime import timedelta

    from pipeline_output.services import incremental
    from pipeline_output.services.maintenance import MaintenanceOptions, maintain

    defs = _defs()
    runtime = get_runtime()
    real = incremental.consume_changes

    def killed(request: Any, **kw: Any) -> Any:
        def boom() -> None:
            raise KeyboardInterrupt("killed between the commit and the ledger record")

        return real(request, **{**kw, "on_written": boom})

    with dg.DagsterInstance.ephemeral() as instance:
        ORDERS["now"] = _orders([(1, "ann", 10), (2, "bob", 5)])
        run_assets(defs, instance, ["orders"])
        first_to = runtime.iceberg.load("orders").current_snapshot().snapshot_id  # type: ignore[union-attr]
        monkeypatch.setattr("pipeline_output.dagster_layer.io_manager.consume_changes", killed)
        with pytest.raises(KeyboardInterrupt):
            run_assets(defs, instance, ["customer_totals"])
        monkeypatch.setattr("pipeline_output.dagster_layer.io_manager.consume_changes", real)
        assert runtime.ledger.consumed_log.last("customer_totals", "orders") is None
        for rows in ([(1, "ann", 20), (3, "carl", 1)], [(2, "bob", 6)]):
            ORDERS["now"] = _orders(rows)
            run_assets(defs, instance, ["orders"])  # `first_to` is no longer the head
        options = MaintenanceOptions(
            audits=False, compact=False, orphans=False, older_than=timedelta(0), retain_last=1
        )
        maintain(runtime.iceberg, [_spec(defs, "orders")], options=options, ledger=runtime.windows)
        table = runtime.iceberg.load("orders")
        assert table is not None and len(table.metadata.snapshots) == 2  # the head and first_to
        meta = mat_meta(run_assets(defs, instance, ["customer_totals"]), "customer_totals")
    assert meta["pipeline_output/changes_full_refresh"] is False
    assert meta["pipeline_output/changes_repaired"] is True
    assert meta["pipeline_output/changes_from_snapshot"] == str(first_to)
    assert (
        meta["pipeline_output/changes_insert"],
        meta["pipeline_output/changes_update_after"],
    ) == (1, 2)
    assert_same_multiset(_stored("customer_totals"), _recompute(_stored("orders")))


def test_after_a_forced_expiry_the_next_run_is_a_full_refresh_whose_metadata_says_why(
    env: str,
) -> None:
    from datetime import timedelta

    from pipeline_output.services.maintenance import MaintenanceOptions, maintain

    defs = _defs()
    runtime = get_runtime()
    with dg.DagsterInstance.ephemeral() as instance:
        ORDERS["now"] = _orders([(1, "ann", 10), (2, "bob", 5)])
        run_assets(defs, instance, ["orders", "customer_totals"])
        ORDERS["now"] = _orders([(1, "ann", 20), (3, "carl", 1)])
        run_assets(defs, instance, ["orders"])  # the position is no longer the head
        options = MaintenanceOptions(
            audits=False, compact=False, orphans=False, older_than=timedelta(0), force=True
        )
        maintain(runtime.iceberg, [_spec(defs, "orders")], options=options, ledger=runtime.windows)
        meta = mat_meta(run_assets(defs, instance, ["customer_totals"]), "customer_totals")
    assert meta["pipeline_output/changes_full_refresh"] is True
    assert "expired" in str(meta["pipeline_output/changes_reason"])


def test_an_upstream_records_change_files_once_a_downstream_consumed_it_not_before(
    env: str,
) -> None:
    defs = _defs()
    runtime = get_runtime()
    spec = _spec(defs, "orders")
    mode = runtime.publisher.resolve(spec)

    def upsert(rows: list[tuple[int, str, int]]) -> Any:
        runtime.publisher.publish(spec, _orders(rows), mode=mode)
        snapshot = runtime.iceberg.load("orders").current_snapshot()  # type: ignore[union-attr]
        return snapshot.snapshot_id, (snapshot.summary or {}).get(CHANGE_FILE)

    upsert([(1, "ann", 10), (2, "bob", 5)])
    s2, recorded = upsert([(1, "ann", 11)])
    assert recorded is None  # no downstream has consumed `orders` yet: nothing recorded
    assert not runtime.ledger.consumed_log.consumed("orders")
    with dg.DagsterInstance.ephemeral() as instance:
        first = run_assets(defs, instance, ["customer_totals"])  # the whole upstream
        assert mat_meta(first, "customer_totals")["pipeline_output/changes_full_refresh"] is True
        assert runtime.ledger.consumed_log.consumed("orders")
        s3, recorded = upsert([(2, "bob", 6), (3, "carl", 1)])
        assert recorded is not None  # consumed now: the upsert records its change
        table = runtime.iceberg.load("orders")
        assert table is not None
        composed = read_changes(  # from the change file alone (refused when it cannot)
            table, from_snapshot=s2, to_snapshot=s3, primary_key=["order_id"], composed=True
        )
        assert composed.counts == {
            "insert": 1,
            "delete": 0,
            "update_before": 1,
            "update_after": 1,
        }
        second = run_assets(defs, instance, ["customer_totals"])
        assert mat_meta(second, "customer_totals")["pipeline_output/changes_insert"] == 1
    assert_same_multiset(_stored("customer_totals"), _recompute(_stored("orders")))


def test_a_changes_input_reads_only_the_columns_its_metadata_asks_for(env: str) -> None:
    SEEN.clear()
    asked = dg.AssetIn(metadata={"columns": ["customer", "amount"]})
    defs = _defs(ins={"orders": asked})
    projected = ["customer", "amount", "_change_type", "_change_snapshot_id", "_change_commit_time"]
    with dg.DagsterInstance.ephemeral() as instance:
        ORDERS["now"] = _orders([(1, "ann", 10), (2, "bob", 5), (3, "bob", 7)])
        run_assets(defs, instance, ["orders", "customer_totals"])  # a full refresh
        ORDERS["now"] = _orders([(1, "ann", 11), (2, "bob", 5), (4, "carl", 3)])
        run_assets(defs, instance, ["orders", "customer_totals"])  # ann updated, carl added
    assert [seen.frame.columns for seen in SEEN] == [projected, projected]
    assert SEEN[-1].counts["update_after"] == 1 and SEEN[-1].counts["insert"] == 1
    assert_same_multiset(_stored("customer_totals"), _recompute(_stored("orders")))


def test_changes_input_columns_that_are_not_a_list_of_names_are_refused_at_load() -> None:
    with pytest.raises(InvalidSpec, match=r"'customer_totals'.*input 'orders'.*columns='customer'"):
        _defs(ins={"orders": dg.AssetIn(metadata={"columns": "customer"})})


def test_changes_input_columns_the_upstream_lacks_fail_the_run_and_write_nothing(env: str) -> None:
    defs = _defs(ins={"orders": dg.AssetIn(metadata={"columns": ["customer", "nope"]})})
    with dg.DagsterInstance.ephemeral() as instance:
        ORDERS["now"] = _orders([(1, "ann", 10)])
        result = run_assets(defs, instance, ["orders", "customer_totals"], raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "['nope']" in str(failure.step_failure_data.error)
    assert get_runtime().iceberg.load("customer_totals") is None
    assert get_runtime().ledger.consumed_log.last("customer_totals", "orders") is None


def test_an_upstream_on_the_legacy_arm_is_refused_when_the_location_loads(env: str) -> None:
    with pytest.raises(
        InvalidSpec, match=r"'customer_totals' reads the changes of 'orders'.*declared mode='pg'"
    ):
        _defs(upstream_mode="pg")


def test_an_upstream_on_the_legacy_arm_by_the_project_default_is_refused_saying_so(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPELINE_OUTPUT_DEFAULT_MODE", "pg")
    with pytest.raises(InvalidSpec) as refused:
        _defs(upstream_mode=None)
    assert "the project's default mode 'pg'" in str(refused.value)
    assert "declare 'orders' mode='iceberg' or mode='dual'" in str(refused.value)


def test_a_downstream_that_cannot_delete_keys_is_refused_at_load() -> None:
    with pytest.raises(InvalidSpec, match=r"strategy 'append_always'"):

        @dataset(primary_key="k", strategy="append_always", mode="iceberg")
        def appended(orders: Changes) -> pl.DataFrame:
            return orders.frame


def _spec(defs: dg.Definitions, name: str) -> Any:
    from pipeline_output.dagster_layer.dataset import spec_of

    return spec_of(defs.resolve_assets_def(name))


def _replace_strategy(spec: Any) -> Any:
    from dataclasses import replace

    return replace(spec, strategy="replace")


def test_an_eager_downstream_is_requested_when_the_upstream_commits(env: str) -> None:
    SEEN.clear()

    @dataset(primary_key="order_id", mode="iceberg")
    def orders() -> pl.DataFrame:
        return ORDERS["now"]

    @dataset(
        primary_key="customer",
        strategy="sync",
        mode="iceberg",
        automation_condition=dg.AutomationCondition.eager(),
    )
    def customer_totals(orders: Changes) -> pl.DataFrame:
        assert orders.current is not None
        now = orders.current.join(orders.keys("customer").lazy(), on="customer", how="semi")
        return orders.with_deletions(
            now.group_by("customer").agg(pl.col("amount").sum().alias("total")), "customer"
        )

    defs = build_definitions(
        datasets=[orders, customer_totals], with_maintenance=False, with_parity_checks=False
    )
    ORDERS["now"] = _orders([(1, "ann", 10)])
    with dg.DagsterInstance.ephemeral() as instance:
        run_assets(defs, instance, ["orders", "customer_totals"])
        quiet = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert quiet.total_requested == 0
        ORDERS["now"] = _orders([(1, "ann", 12)])
        run_assets(defs, instance, ["orders"])  # the upstream commits a snapshot
        ticked = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, cursor=quiet.cursor
        )
        assert ticked.get_requested_partitions(dg.AssetKey("customer_totals")) == {None}


def test_a_downstream_keyed_by_two_columns_or_with_two_changes_inputs_is_refused_at_load() -> None:
    with pytest.raises(InvalidSpec, match=r"primary key of one column"):

        @dataset(primary_key=("k", "j"), strategy="sync", mode="iceberg")
        def pairs(orders: Changes) -> pl.DataFrame:
            return orders.frame

    with pytest.raises(InvalidSpec, match=r"consumes the changes of one upstream"):

        @dataset(primary_key="k", strategy="sync", mode="iceberg")
        def both(orders: Changes, customers: Changes) -> pl.DataFrame:
            return orders.frame


def test_a_datasets_data_version_is_its_iceberg_snapshot(env: str) -> None:
    defs = _defs()
    ORDERS["now"] = _orders([(1, "ann", 10)])
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, ["orders", "customer_totals"])
        versions = {
            e.asset_key.path[-1]: e.event_specific_data.materialization.tags.get(  # type: ignore[union-attr]
                "dagster/data_version"
            )
            for e in result.get_asset_materialization_events()
        }
    runtime = get_runtime()
    for name in ("orders", "customer_totals"):
        snapshot = runtime.iceberg.load(name).current_snapshot()  # type: ignore[union-attr]
        assert versions[name] == str(snapshot.snapshot_id)
