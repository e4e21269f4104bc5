"""Write-audit-publish under Dagster's real execution (issue 15): an audited dataset's run stages
its native write on `audit-<run id>`, its blocking checks — the parity check and the user's own
`@asset_check`s, which read the branch — run against it, and only then does main move, by
exactly one snapshot. A failing check (a user check, or parity with an injected mismatch) leaves
main, every reader's view and the legacy arm unchanged, and keeps the branch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg
import polars as pl
import pytest

from pipeline_output.infra.settings import Settings
from pipeline_output.stores.iceberg.table.tables import head
from pipeline_output_tests.dagster_runs import run_assets
from pipeline_output_tests.iceberg_harness import customers
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.publishers import corrupt_pg_row, pg_docs

ROWS: dict[str, pl.DataFrame] = {}
SEEN: dict[str, list[int]] = {}


@pytest.fixture
def runtime_env(settings_env: Settings) -> Iterator[Settings]:
    from pipeline_output.dagster_layer.resource import reset_runtime

    reset_runtime()
    ROWS.clear()
    SEEN.clear()
    yield settings_env
    reset_runtime()


def audited_defs(*, mode: str = "iceberg", audit: bool = True, bad_id: int = 999) -> dg.Definitions:
    """`items` (audited), a user check that fails when the staged rows hold `bad_id`, and a
    downstream `totals` that must only ever read published rows."""
    from pipeline_output.dagster_layer.build import build_definitions
    from pipeline_output.dagster_layer.dataset import dataset

    @dataset("items", primary_key="id", mode=mode, audit=audit)  # type: ignore[arg-type]
    def items() -> pl.DataFrame:
        return ROWS["items"]

    @dg.asset_check(asset="items", blocking=True, name="no_bad_id")
    def no_bad_id(items: pl.LazyFrame) -> dg.AssetCheckResult:
        ids = items.select("id").collect()["id"].to_list()
        SEEN["check"] = sorted(ids)
        return dg.AssetCheckResult(passed=bad_id not in ids, metadata={"rows": len(ids)})

    @dataset("totals", primary_key="id", strategy="replace", mode="iceberg")
    def totals(items: pl.LazyFrame) -> pl.LazyFrame:
        SEEN["totals"] = sorted(items.select("id").collect()["id"].to_list())
        return items.select("id", "amount")

    return build_definitions(datasets=[items, totals], asset_checks=[no_bad_id])


def evaluations(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    """The run's check evaluations by check name."""
    return {
        e.event_specific_data.check_name: e.event_specific_data  # type: ignore[union-attr]
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    }


def main_snapshot(name: str = "items") -> int | None:
    from pipeline_output.dagster_layer.resource import get_runtime

    table = get_runtime().iceberg.load(name)
    return head(table) if table is not None else None


def upsert(before: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    return pl.concat([before.join(rows, on="id", how="anti"), rows])


def test_an_audited_run_publishes_one_snapshot_after_its_checks_read_the_branch(runtime_env):
    from pipeline_output.dagster_layer.resource import get_runtime

    defs = audited_defs()
    instance = dg.DagsterInstance.ephemeral()
    ROWS["items"] = customers(range(1, 6))
    first = run_assets(defs, instance, ["items", "totals"])
    assert first.success and main_snapshot() is not None
    before = main_snapshot()

    ROWS["items"] = customers(range(4, 9), version=1)
    run = run_assets(defs, instance, ["items", "totals"])
    assert run.success
    expected = upsert(customers(range(1, 6)), customers(range(4, 9), version=1))
    assert SEEN["check"] == list(range(1, 9)), "the user check read the staged branch"
    assert SEEN["totals"] == list(range(1, 9))
    rt = get_runtime()
    table = rt.iceberg.load("items")
    assert table.snapshot_by_id(main_snapshot()).parent_snapshot_id == before, "one new snapshot"
    assert_same_multiset(rt.iceberg.read("items"), expected)
    audit = rt.ledger.audit_log.audit("items", run.run_id)
    # parity compares nothing in an iceberg-only audit (it reports no result: skipped), so it
    # does not gate the publish
    assert audit.state == "published" and audit.gating_checks == ["no_bad_id"]
    assert not [r for r in table.metadata.refs if r.startswith("audit-")]
    meta = {
        k: getattr(v, "value", v)
        for e in run.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("items")
        for k, v in e.event_specific_data.materialization.metadata.items()  # type: ignore[union-attr]
    }
    assert meta["iceberg/audit_branch"] == f"audit-{run.run_id}"


def test_a_failing_user_check_leaves_main_and_readers_unchanged_and_keeps_the_branch(
    runtime_env,
):
    from pipeline_output.dagster_layer.resource import get_runtime

    defs = audited_defs(bad_id=42)
    instance = dg.DagsterInstance.ephemeral()
    ROWS["items"] = customers(range(1, 6))
    assert run_assets(defs, instance, ["items"]).success
    rt = get_runtime()
    before, rows_before = main_snapshot(), rt.iceberg.read("items")

    ROWS["items"] = customers([3, 42], version=1)
    bad = run_assets(defs, instance, ["items", "totals"], raise_on_error=False)
    assert not bad.success
    assert not evaluations(bad)["no_bad_id"].passed
    assert SEEN["check"] == [1, 2, 3, 4, 5, 42], "the check saw the staged rows"
    assert main_snapshot() == before
    assert_same_multiset(rt.iceberg.read("items"), rows_before)
    assert "totals" not in SEEN, "downstream never read the unpublished rows"
    audit = rt.ledger.audit_log.audit("items", bad.run_id)
    assert audit.state == "failed" and "no_bad_id" in (audit.reason or "")
    assert audit.branch in rt.iceberg.load("items").metadata.refs


def test_a_dual_audit_with_an_injected_parity_mismatch_changes_neither_arm(runtime_env, pg_db_url):
    from pipeline_output.dagster_layer.resource import get_runtime

    defs = audited_defs(mode="dual")
    instance = dg.DagsterInstance.ephemeral()
    ROWS["items"] = customers(range(1, 11))
    assert run_assets(defs, instance, ["items"]).success
    rt = get_runtime()
    assert (
        rt.ledger.audit_log.audit("items", rt.ledger.audit_log.audits("items")[0].run_id).state
        == "published"
    )
    corrupt_pg_row(pg_db_url, "items", "3", "name", "tampered")  # preserved by the upsert
    legacy_before, main_before = pg_docs(pg_db_url, "items"), main_snapshot()

    ROWS["items"] = customers(range(8, 14), version=1)
    bad = run_assets(defs, instance, ["items"], raise_on_error=False)
    parity = evaluations(bad)["parity"]
    assert not bad.success
    assert not parity.passed and "parity FAIL" in (parity.description or "")
    assert main_snapshot() == main_before
    assert pg_docs(pg_db_url, "items") == legacy_before
    assert rt.ledger.audit_log.audit("items", bad.run_id).state == "failed"


def test_a_dual_audit_that_passes_writes_the_legacy_arm_at_the_publish(runtime_env, pg_db_url):
    from pipeline_output.dagster_layer.resource import get_runtime

    defs = audited_defs(mode="dual")
    instance = dg.DagsterInstance.ephemeral()
    ROWS["items"] = customers(range(1, 11))
    run_assets(defs, instance, ["items"])
    ROWS["items"] = customers(range(8, 14), version=1)
    run = run_assets(defs, instance, ["items"])
    rt = get_runtime()
    expected = upsert(customers(range(1, 11)), customers(range(8, 14), version=1))
    assert run.success and rt.ledger.audit_log.audit("items", run.run_id).state == "published"
    assert_same_multiset(rt.postgres.read("items"), expected)
    assert_same_multiset(rt.iceberg.read("items"), expected)


def test_asset_config_audit_stages_one_run_of_a_dataset_declared_without_audit(runtime_env):
    from pipeline_output.dagster_layer.resource import get_runtime

    defs = audited_defs(audit=False, bad_id=42)
    instance = dg.DagsterInstance.ephemeral()
    ROWS["items"] = customers(range(1, 4))
    run_assets(defs, instance, ["items"])
    before = main_snapshot()
    ROWS["items"] = customers([42])
    config = {"ops": {"items": {"config": {"audit": True}}}}
    bad = run_assets(defs, instance, ["items"], run_config=config, raise_on_error=False)
    assert not bad.success and main_snapshot() == before
    assert get_runtime().ledger.audit_log.audit("items", bad.run_id).state == "failed"
    plain = run_assets(defs, instance, ["items"], raise_on_error=False)  # no audit: written
    assert (
        main_snapshot() != before
        and get_runtime().ledger.audit_log.audit("items", plain.run_id) is None
    )


def test_an_audited_run_without_blocking_checks_publishes_when_its_step_ends(runtime_env):
    from pipeline_output.dagster_layer.build import build_definitions
    from pipeline_output.dagster_layer.dataset import dataset
    from pipeline_output.dagster_layer.resource import get_runtime

    @dataset("items", primary_key="id", mode="iceberg", audit=True)
    def items() -> pl.DataFrame:
        return customers(range(1, 4))

    defs = build_definitions(datasets=[items], with_parity_checks=False)
    run = run_assets(defs, dg.DagsterInstance.ephemeral(), ["items"])
    audit = get_runtime().ledger.audit_log.audit("items", run.run_id)
    assert run.success and audit.gating_checks == [] and audit.state == "published"
    assert_same_multiset(get_runtime().iceberg.read("items"), customers(range(1, 4)))
    # one hook for success and failure: the step records one hook event, not a skipped one too
    hooks = [e.event_type for e in run.all_events if e.event_type_value.startswith("HOOK_")]
    assert hooks == [dg.DagsterEventType.HOOK_COMPLETED]
