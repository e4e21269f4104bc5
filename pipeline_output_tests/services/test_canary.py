"""The canary (issue 5): the same scenario suite on both arms, dual writes and parity, persisted flips
and run-config overrides, the drain (the seed's latent bug #0), failure ordering of dual writes, and
downstream reads from the authoritative arm.

Real Postgres and a real pyiceberg SQL catalog in every test; no mocks. Failures are produced by real
means: an edited `dataset_rows` document, a table data directory replaced by a file, a deferred
Postgres constraint trigger that raises at COMMIT.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal

from pipeline_output import DatasetSpec, Delta, IcebergStore, Window
from pipeline_output.errors import PipelineOutputError
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.ledger import Ledger
from pipeline_output.services.canary import DrainRefused, check_parity, drain, flip, status
from pipeline_output.services.publish import Publisher
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.dagster_runs import check_evals, mat_meta, run_assets
from pipeline_output_tests.iceberg_harness import customers
from pipeline_output_tests.oracle import assert_same_multiset, expect
from pipeline_output_tests.publishers import (
    corrupt_pg_row,
    make_publisher,
    mode,
    pg_deploy_ids,
    pg_docs,
)

STRATEGIES = ["snapshot_replace", "append_always", "append_new", "replace", "sync"]
ARMS = ("pg", "iceberg")


# --- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def pub(pg_db_url: str, catalog: Any) -> Publisher:
    return make_publisher(pg_db_url, catalog)


@pytest.fixture
def reread(pg_db_url: str, fresh_catalog: Callable[[], Any]) -> Callable[[str, DatasetSpec], Any]:
    """Read one arm through brand-new store handles (nothing cached); None when never written."""

    def read(arm: str, spec: DatasetSpec) -> pl.DataFrame | None:
        if arm == "pg":
            store: Any = PostgresStore(pg_db_url, ledger=Ledger(pg_db_url))
        else:
            cat = fresh_catalog()
            store = IcebergStore(cat, "datasets", lock=AdvisoryLock(pg_db_url))
        if not store.target_state(spec).has_snapshot:
            return None
        return store.read(spec)  # type: ignore[no-any-return]

    return read


# --- the same scenario suite on both arms -------------------------------------------------------

W1 = Window(low=10, high=20)
W2 = Window(low=20, high=40)


def full_steps() -> list[tuple[pl.DataFrame, Window | None]]:
    """First deploy, re-deploy (21..30 changed, 31..40 same, 41..60 new, 1..20 absent), rerun."""
    redeploy = pl.concat(
        [customers(range(21, 31), version=1), customers(range(31, 41)), customers(range(41, 61))]
    )
    return [(customers(range(1, 41)), None), (redeploy, None), (redeploy, None)]


def window_steps() -> list[tuple[pl.DataFrame, Window | None]]:
    """First deploy inside (10, 20], a second window (20, 40], then (10, 20] again with 11..14
    changed, 15..18 identical, 19/20/101..103 absent and 104 new (boundary seq 20 inside), rerun."""
    again = pl.concat(
        [
            customers(range(11, 15), version=3),
            customers(range(15, 19), version=2),
            customers([104], seq=[20], version=3),
        ]
    )
    first = pl.concat(
        [
            customers(range(11, 15), version=2),
            customers(range(15, 19), version=2),
            customers([19, 20]),
            customers([101, 102, 103], seq=[11, 15, 20], version=2),
        ]
    )
    return [(first, W1), (customers(range(21, 41)), W2), (again, W1), (again, W1)]


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def _arm_params() -> list[Any]:
    """`dual` runs the suite on both arms at once (both checked against the oracle at every step);
    the single-arm runs of the other strategies are in the slow set to keep the default run short."""
    out: list[Any] = []
    for arm in ("pg", "iceberg", "dual"):
        for strategy in STRATEGIES:
            marks = [pytest.mark.slow] if arm != "dual" and strategy != "snapshot_replace" else []
            out.append(pytest.param(arm, strategy, marks=marks, id=f"{arm}-{strategy}"))
    return out


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
@pytest.mark.parametrize(("arm", "strategy"), _arm_params())
def test_scenario_suite_every_arm_ends_equal_to_the_polars_oracle(
    pub, reread, arm, strategy, windowed
):
    spec = DatasetSpec(
        name="customers",
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        delta=Delta(source="raw", watermark="seq") if windowed else None,
    )
    arms = ARMS if arm == "dual" else (arm,)
    oracle: pl.DataFrame | None = None
    for step, (data, window) in enumerate(window_steps() if windowed else full_steps()):
        exp = expect(
            strategy,
            oracle,
            data,
            ["id"],
            window=(window.low, window.high) if window is not None else None,
            watermark="seq" if windowed else None,
        )
        out = pub.publish(spec, data, mode=mode(arm), window=window, run_id=f"s{step}")
        assert sorted(out.results) == sorted(arms)
        for a in arms:
            res = out.results[a]
            assert (res.write_mode, res.first_deploy) == (exp.write_mode, exp.first_deploy), (
                a,
                step,
            )
            assert res.rows_total_after == exp.table.height, (a, step)
            got = reread(a, spec)
            assert got is not None, (a, step)
            assert_same_multiset(got, exp.table)
        for a in set(ARMS) - set(arms):
            assert reread(a, spec) is None, f"mode {arm} must not write the {a} arm"
        oracle = exp.table
    if arm == "dual":
        pg, ice = reread("pg", spec), reread("iceberg", spec)
        assert pg.schema == ice.schema
        assert check_parity(pub, spec).passed


def test_dual_write_counters_agree_and_parity_passes_on_every_type(pub, reread):
    from pipeline_output_tests.stores.arms import typed_frame

    spec = DatasetSpec(name="typed", primary_key="id")
    out = pub.publish(spec, typed_frame(), mode=mode("dual"))
    assert out.results["pg"].rows_total_after == out.results["iceberg"].rows_total_after == 5
    report = check_parity(pub, spec)
    assert report.passed, report.summary()
    assert (report.pg_count, report.iceberg_count) == (5, 5)
    changed = typed_frame().with_columns(text=pl.lit("changed"))
    pub.publish(spec, changed, mode=mode("dual"))
    assert check_parity(pub, spec).passed
    assert reread("pg", spec)["text"].to_list() == ["changed"] * 5


# --- parity reports the differing keys ------------------------------------------------------------


def test_an_edited_legacy_row_fails_parity_naming_its_key_on_both_sides(pub, pg_db_url):
    spec = DatasetSpec(name="customers", primary_key="id", strategy="snapshot_replace")
    pub.publish(spec, customers(range(1, 41)), mode=mode("dual"))
    assert check_parity(pub, spec).passed
    corrupt_pg_row(pg_db_url, "customers", "17", "name", "tampered")
    report = check_parity(pub, spec)
    assert not report.passed
    assert (report.pg_count, report.iceberg_count) == (40, 40)
    assert report.only_in_pg == [17] and report.only_in_iceberg == [17]
    assert "FAIL" in report.summary()
    last = Ledger(pg_db_url).parity_log.last_parity("customers")
    assert last is not None and not last.passed
    assert last.differing_keys == {"only_in_pg": [17], "only_in_iceberg": [17]}


def test_a_missing_legacy_row_is_reported_only_in_iceberg_and_the_count_differs(pub, pg_db_url):
    spec = DatasetSpec(name="customers", primary_key="id", strategy="snapshot_replace")
    pub.publish(spec, customers(range(1, 41)), mode=mode("dual"))
    with psycopg.connect(pg_db_url) as conn:
        conn.execute(
            "DELETE FROM pipeline_output.dataset_rows WHERE dataset_id = 'customers' AND pk = '5'"
        )
    report = check_parity(pub, spec)
    assert not report.passed
    assert (report.pg_count, report.iceberg_count) == (39, 40)
    assert report.only_in_pg == [] and report.only_in_iceberg == [5]


def test_parity_lists_at_most_20_differing_keys_per_side(pub, pg_db_url):
    spec = DatasetSpec(name="customers", primary_key="id", strategy="snapshot_replace")
    pub.publish(spec, customers(range(1, 41)), mode=mode("dual"))
    with psycopg.connect(pg_db_url) as conn:
        conn.execute(
            "UPDATE pipeline_output.dataset_rows SET data = jsonb_set(data, '{name}', '\"x\"') "
            "WHERE dataset_id = 'customers'"
        )
    report = check_parity(pub, spec)
    assert not report.passed
    assert len(report.only_in_pg) == 20 and len(report.only_in_iceberg) == 20
    assert set(report.only_in_pg) <= set(range(1, 41))


def test_parity_is_order_independent_and_counts_duplicates(pub, pg_db_url):
    spec = DatasetSpec(name="log", strategy="append_always")
    rows = customers(range(1, 6))
    pub.publish(spec, rows, mode=mode("dual"))
    pub.publish(spec, rows.reverse(), mode=mode("dual"))
    assert check_parity(pub, spec).passed
    # one duplicate of the multiset removed on the legacy side: same set, different multiset
    with psycopg.connect(pg_db_url) as conn:
        conn.execute(
            "DELETE FROM pipeline_output.dataset_rows WHERE dataset_id = 'log' AND row_index = "
            "(SELECT max(row_index) FROM pipeline_output.dataset_rows WHERE dataset_id = 'log')"
        )
    report = check_parity(pub, spec)
    assert not report.passed and (report.pg_count, report.iceberg_count) == (9, 10)


# --- bad input ----------------------------------------------------------------------------------


def test_flip_to_an_unknown_mode_or_dataset_is_refused_listing_the_valid_ones(pub, pg_db_url):
    specs = {"customers": DatasetSpec(name="customers", primary_key="id")}
    with pytest.raises(PipelineOutputError) as err:
        flip(pub, specs, "customers", "parquet", who="t")
    assert all(m in str(err.value) for m in ("pg", "iceberg", "dual")), err.value
    with pytest.raises(PipelineOutputError) as err:
        flip(pub, specs, "nope", "dual", who="t")
    assert "customers" in str(err.value), err.value
    with pytest.raises(PipelineOutputError, match="pg, iceberg, dual"):
        Ledger(pg_db_url).flip_log.flip("customers", "both", who="t")
    assert Ledger(pg_db_url).flip_log.flip_history("customers") == []
    assert pub.resolve(specs["customers"]).source == "project default"


def _break_table_data_dir(catalog: Any, name: str) -> tuple[Path, Path]:
    """Move the Iceberg table's data directory aside and put a regular file in its place: every new
    data file write fails with an OS error (even as root); the catalog stays readable."""
    table = catalog.load_table(("datasets", name))
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    assert data_dir.is_dir(), data_dir
    saved = data_dir.with_name("data.saved")
    data_dir.rename(saved)
    data_dir.write_text("not a directory")
    return data_dir, saved


def _restore_table_data_dir(data_dir: Path, saved: Path) -> None:
    data_dir.unlink()
    saved.rename(data_dir)


@pytest.mark.parametrize(
    "strategy",
    [
        "snapshot_replace",
        "sync",
        pytest.param("append_always", marks=pytest.mark.slow),
        pytest.param("replace", marks=pytest.mark.slow),
    ],
)
def test_dual_write_whose_iceberg_write_fails_leaves_the_legacy_arm_unchanged(
    pub, catalog, reread, pg_db_url, strategy
):
    spec = DatasetSpec(name="customers", primary_key="id", strategy=strategy)  # type: ignore[arg-type]
    pub.publish(spec, customers(range(1, 41)), mode=mode("dual"), run_id="ok")
    before_docs = pg_docs(pg_db_url, "customers")
    before_ids = pg_deploy_ids(pg_db_url, "customers")
    before_ice = reread("iceberg", spec)
    snapshots = [s.snapshot_id for s in catalog.load_table(("datasets", "customers")).snapshots()]
    broken = _break_table_data_dir(catalog, "customers")

    changed = pl.concat([customers(range(21, 31), version=1), customers(range(41, 61))])
    with pytest.raises(Exception) as err:
        pub.publish(spec, changed, mode=mode("dual"), run_id="broken")
    assert not isinstance(err.value, AssertionError)
    _restore_table_data_dir(*broken)
    assert pg_docs(pg_db_url, "customers") == before_docs, "legacy rows changed"
    assert pg_deploy_ids(pg_db_url, "customers") == before_ids, "a pg deploy was recorded"
    assert [d.status for d in Ledger(pg_db_url).deploy_log.deploys("customers")].count(
        "diverged"
    ) == 0
    after_ice = reread("iceberg", spec)
    assert_frame_equal(after_ice, before_ice)
    table = catalog.load_table(("datasets", "customers"))
    assert [s.snapshot_id for s in table.snapshots()] == snapshots


def test_a_postgres_commit_failing_after_the_iceberg_commit_is_recorded_as_divergence(
    pub, pg_db_url
):
    """The one gap the ordering cannot close, produced for real: a deferred constraint trigger that
    raises at COMMIT, i.e. after the Iceberg snapshot was committed."""
    spec = DatasetSpec(name="customers", primary_key="id")
    pub.publish(spec, customers(range(1, 11)), mode=mode("dual"))
    with psycopg.connect(pg_db_url) as conn:
        conn.execute(
            "CREATE FUNCTION pipeline_output.fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$"
        )
        conn.execute(
            "CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT OR UPDATE "
            "ON pipeline_output.dataset_rows DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
            "EXECUTE FUNCTION pipeline_output.fail_at_commit()"
        )
    before = pg_docs(pg_db_url, "customers")
    with pytest.raises(PipelineOutputError, match="diverged"):
        pub.publish(spec, customers(range(5, 15), version=1), mode=mode("dual"), run_id="gap")
    assert pg_docs(pg_db_url, "customers") == before
    ledger = Ledger(pg_db_url)
    last_pg = ledger.deploy_log.last_deploy("customers", "pg")
    assert last_pg is not None and last_pg.status == "diverged" and last_pg.run_id == "gap"
    parity = ledger.parity_log.last_parity("customers")
    assert parity is not None and not parity.passed
    board = {r.dataset: r for r in status(pub, {"customers": spec})}
    assert "diverged" in board["customers"].last_pg_deploy
    assert board["customers"].last_parity.startswith("FAIL")
    # and the diverged state blocks the drain even once flipped to iceberg
    ledger.flip_log.flip("customers", "iceberg", who="t")
    with pytest.raises(DrainRefused, match="parity"):
        drain(pub, spec)


# --- the end of a migration: drain, and the seed's latent bug #0 ----------------------------------


def test_drain_then_native_snapshot_replace_redeploy_preserves_history(pub, pg_db_url, reread):
    spec = DatasetSpec(name="customers", primary_key="id", strategy="snapshot_replace")
    specs = {"customers": spec}
    flip(pub, specs, "customers", "dual", who="t")
    first = pub.publish(spec, customers(range(1, 41)), mode=pub.resolve(spec))
    assert set(first.results) == set(ARMS)
    flip(pub, specs, "customers", "iceberg", who="t")
    assert check_parity(pub, spec).passed
    assert drain(pub, spec) == 40
    assert pg_docs(pg_db_url, "customers") == []
    assert reread("iceberg", spec).height == 40

    resolved = pub.resolve(spec)
    assert (resolved.mode, resolved.source) == ("iceberg", "flip")
    out = pub.publish(spec, customers(range(35, 46), version=1), mode=resolved, run_id="after")
    res = out.results["iceberg"]
    assert (res.first_deploy, res.write_mode) == (False, "upsert"), "drained arm wiped history"
    assert (res.rows_preserved, res.rows_total_after) == (34, 45)
    got = reread("iceberg", spec)
    expected = pl.concat([customers(range(1, 35)), customers(range(35, 46), version=1)])
    assert_same_multiset(got, expected)
    assert "pg" not in out.results and pg_docs(pg_db_url, "customers") == []


def test_drain_is_refused_unless_flipped_to_iceberg_with_a_passing_last_parity(pub, pg_db_url):
    spec = DatasetSpec(name="customers", primary_key="id")
    specs = {"customers": spec}
    pub.publish(spec, customers(range(1, 11)), mode=mode("dual"))
    rows = pg_docs(pg_db_url, "customers")

    with pytest.raises(DrainRefused, match="flip it to iceberg"):
        drain(pub, spec)  # project default pg
    flip(pub, specs, "customers", "dual", who="t")
    assert check_parity(pub, spec).passed
    with pytest.raises(DrainRefused, match="'dual'"):
        drain(pub, spec)  # parity passed, but not flipped to iceberg
    assert pg_docs(pg_db_url, "customers") == rows

    other = DatasetSpec(name="orders", primary_key="id")
    pub.publish(other, customers(range(1, 4)), mode=mode("dual"))
    flip(pub, {"orders": other}, "orders", "iceberg", who="t")
    with pytest.raises(DrainRefused, match="never ran"):
        drain(pub, other)

    flip(pub, specs, "customers", "iceberg", who="t")
    corrupt_pg_row(pg_db_url, "customers", "3", "name", "tampered")
    assert not check_parity(pub, spec).passed
    with pytest.raises(DrainRefused, match="failed"):
        drain(pub, spec)
    assert len(pg_docs(pg_db_url, "customers")) == 10


# --- mode resolution and flip history -----------------------------------------------------------


def test_mode_resolution_order_run_config_flip_dataset_default_project_default(
    pg_db_url, catalog, monkeypatch
):
    pub = make_publisher(pg_db_url, catalog)
    plain = DatasetSpec(name="a", primary_key="id")
    declared = DatasetSpec(name="b", primary_key="id", mode="iceberg")
    assert (pub.resolve(plain).mode, pub.resolve(plain).source) == ("pg", "project default")
    assert (pub.resolve(declared).mode, pub.resolve(declared).source) == (
        "iceberg",
        "declared",
    )
    pub.ledger.flip_log.flip("b", "dual", who="t")
    assert (pub.resolve(declared).mode, pub.resolve(declared).source) == ("dual", "flip")
    got = pub.resolve(declared, override="pg")
    assert (got.mode, got.source) == ("pg", "run config")
    with pytest.raises(PipelineOutputError, match="pg, iceberg, dual"):
        pub.resolve(declared, override="both")
    project = Publisher(
        iceberg=pub.iceberg, postgres=pub.postgres, ledger=pub.ledger, project_default="iceberg"
    )
    assert project.resolve(plain).mode == "iceberg"


def test_flip_history_survives_a_new_ledger_and_records_who_when_from_to(pub, pg_db_url, catalog):
    specs = {"customers": DatasetSpec(name="customers", primary_key="id")}
    a = flip(pub, specs, "customers", "dual", who="alice", reason="start canary")
    b = flip(pub, specs, "customers", "iceberg", who="bob")
    del pub
    fresh = Ledger(pg_db_url)  # a "restart": nothing shared with the writer
    history = fresh.flip_log.flip_history("customers")
    assert [(h.from_mode, h.to_mode, h.who) for h in history] == [
        (None, "dual", "alice"),
        ("dual", "iceberg", "bob"),
    ]
    assert history[0].reason == "start canary" and history[0].at <= history[1].at
    assert [h.id for h in history] == [a.id, b.id]
    assert fresh.flip_log.current_flip("customers") == "iceberg"
    again = make_publisher(pg_db_url, catalog)
    assert (again.resolve(specs["customers"]).mode, again.resolve(specs["customers"]).source) == (
        "iceberg",
        "flip",
    )


# --- Dagster: run config override, parity check, authoritative reads -----------------------------

ROWS: dict[str, pl.DataFrame] = {}


def small_defs(*, with_down: bool = True) -> dg.Definitions:
    from pipeline_output.dagster_layer.build import build_definitions
    from pipeline_output.dagster_layer.dataset import dataset

    @dataset("up", primary_key="id", strategy="snapshot_replace")
    def up() -> pl.DataFrame:
        return ROWS["up"]

    datasets = [up]
    if with_down:

        @dataset("down", primary_key="id", strategy="replace", mode="iceberg")
        def down(up: pl.LazyFrame) -> pl.LazyFrame:
            return up.select("id", "name")

        datasets.append(down)
    return build_definitions(datasets=datasets)


def test_run_config_mode_overrides_the_flip_for_that_run_only(runtime_env, pg_db_url):
    from pipeline_output.dagster_layer.resource import get_runtime

    ROWS["up"] = customers(range(1, 11))
    defs = small_defs(with_down=False)
    instance = dg.DagsterInstance.ephemeral()
    ledger = get_runtime().ledger
    ledger.flip_log.flip("up", "pg", who="t")

    first = run_assets(
        defs, instance, ["up"], run_config={"ops": {"up": {"config": {"mode": "iceberg"}}}}
    )
    assert mat_meta(first, "up")["mode"] == "iceberg (from run config)"
    assert ledger.deploy_log.last_deploy("up", "pg") is None and pg_docs(pg_db_url, "up") == []
    assert ledger.deploy_log.last_deploy("up", "iceberg") is not None
    assert ledger.flip_log.current_flip("up") == "pg", "a run override must not persist"

    ROWS["up"] = customers(range(1, 13), version=1)
    second = run_assets(defs, instance, ["up"])
    assert mat_meta(second, "up")["mode"] == "pg (from flip)"
    assert mat_meta(second, "up")["arms"] == "pg"
    assert len(pg_docs(pg_db_url, "up")) == 12
    assert len(ledger.deploy_log.deploys("up", arm="iceberg")) == 1, (
        "the next run wrote iceberg again"
    )
    assert [h.to_mode for h in ledger.flip_log.flip_history("up")] == ["pg"]


def test_dual_run_parity_check_passes_then_a_preserved_corrupt_row_fails_it_and_blocks_downstream(
    runtime_env, pg_db_url
):
    from pipeline_output.dagster_layer.resource import get_runtime

    ROWS["up"] = customers(range(1, 21))
    defs = small_defs()
    instance = dg.DagsterInstance.ephemeral()
    get_runtime().ledger.flip_log.flip("up", "dual", who="t")

    ok = run_assets(defs, instance, ["up", "down"])
    evals = check_evals(ok)
    assert evals["up"].passed, evals["up"].description
    assert "parity PASS" in (evals["up"].description or "")
    # down is iceberg-only: nothing to compare, so no result (Dagster shows the check skipped),
    # never a green pass
    assert "down" not in evals

    # 3 is not in the next compute, so snapshot_replace preserves it as it is in each arm
    corrupt_pg_row(pg_db_url, "up", "3", "name", "tampered")
    ROWS["up"] = customers(range(10, 25), version=1)
    bad = run_assets(defs, instance, ["up", "down"], raise_on_error=False)
    evals = check_evals(bad)
    assert not evals["up"].passed
    meta = {k: getattr(v, "value", v) for k, v in evals["up"].metadata.items()}
    assert meta["only_in_pg"] == [3] and meta["only_in_iceberg"] == [3], meta
    assert (meta["pg_count"], meta["iceberg_count"]) == (24, 24)
    materialised = {
        e.event_specific_data.materialization.asset_key.to_user_string()  # type: ignore[union-attr]
        for e in bad.get_asset_materialization_events()
    }
    assert materialised == {"up"}, "a failed blocking parity check must stop downstream assets"
    assert not bad.success


@pytest.mark.parametrize(
    ("flipped", "dual_reads_from", "expected_arm"),
    [
        (None, None, "pg"),
        ("pg", None, "pg"),
        ("dual", None, "pg"),
        ("dual", "iceberg", "iceberg"),
        ("iceberg", None, "iceberg"),
    ],
)
def test_downstream_reads_the_authoritative_arm_of_an_upstream_whose_arms_differ(
    runtime_env, pg_db_url, monkeypatch, flipped, dual_reads_from, expected_arm
):
    from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime

    if dual_reads_from:
        monkeypatch.setenv("PIPELINE_OUTPUT_DUAL_READS_FROM", dual_reads_from)
        reset_runtime()
    rt = get_runtime()
    spec = DatasetSpec(name="up", primary_key="id", strategy="snapshot_replace")
    rt.publisher.publish(spec, customers(range(1, 6)), mode=mode("pg"))
    rt.publisher.publish(spec, customers(range(1, 6), version=7), mode=mode("iceberg"))
    if flipped:
        rt.ledger.flip_log.flip("up", flipped, who="t")
    defs = small_defs()
    result = run_assets(defs, dg.DagsterInstance.ephemeral(), ["down"])
    assert result.success
    names = sorted(rt.iceberg.read(DatasetSpec(name="down", primary_key="id"))["name"].to_list())
    version = 0 if expected_arm == "pg" else 7
    assert names == sorted(f"c{i}-v{version}" for i in range(1, 6))


def test_status_lists_mode_source_last_deploys_rows_and_parity(pub, pg_db_url):
    specs = {
        "a": DatasetSpec(name="a", primary_key="id"),
        "b": DatasetSpec(name="b", primary_key="id", mode="iceberg"),
        "c": DatasetSpec(name="c", primary_key="id"),
    }
    flip(pub, specs, "a", "dual", who="t")
    pub.publish(specs["a"], customers(range(1, 8)), mode=pub.resolve(specs["a"]))
    check_parity(pub, specs["a"])
    pub.publish(specs["b"], customers(range(1, 4)), mode=pub.resolve(specs["b"]))
    board = {r.dataset: r for r in status(pub, specs)}
    assert sorted(board) == ["a", "b", "c"]
    a, b, c = board["a"], board["b"], board["c"]
    assert (a.mode, a.mode_source, a.pg_rows, a.iceberg_rows) == ("dual", "flip", 7, 7)
    assert a.last_pg_deploy.startswith("succeeded replace")
    assert a.last_iceberg_deploy.startswith("succeeded replace")
    assert a.last_parity.startswith("PASS")
    assert (b.mode, b.mode_source, b.iceberg_rows, b.last_pg_deploy) == (
        "iceberg",
        "declared",
        3,
        "-",
    )
    assert b.pg_rows in (0, None) and b.last_parity == "-"
    assert (c.mode, c.mode_source, c.last_pg_deploy, c.last_iceberg_deploy) == (
        "pg",
        "project default",
        "-",
        "-",
    )
    assert c.iceberg_rows is None


# --- the demo: every dataset in dual passes parity; a corrupted arm fails it ----------------------

DEMO = ["customers", "orders", "order_events", "daily_revenue", "active_products", "customer_churn"]


def test_demo_every_dataset_in_dual_passes_parity_and_a_corrupted_row_fails_it(
    runtime_env, pg_db_url
):
    from pipeline_output.dagster_layer.resource import get_runtime
    from pipeline_output.dagster_layer.runner import materialize
    from pipeline_output.demo import shop_data
    from pipeline_output.demo.code_location import defs

    shop_data.seed(pg_db_url)
    rt = get_runtime()
    for name in DEMO:
        rt.ledger.flip_log.flip(name, "dual", who="test")
    instance = dg.DagsterInstance.ephemeral()
    report = materialize(defs, instance)
    assert report.ok, report.failures
    summaries = report.rows
    assert {s.asset for s in summaries} == set(DEMO)
    assert all(s.mode == "dual (from flip)" for s in summaries), summaries

    evaluations: dict[str, Any] = {}
    for run_id in {s.run_id for s in summaries}:
        records = instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION, limit=1000
        ).records
        for record in records:
            ev = record.event_log_entry.dagster_event.event_specific_data
            if ev.check_name == "parity":  # each dataset also has a `table_health` check
                evaluations[ev.asset_key.to_user_string()] = ev
    assert set(evaluations) == set(DEMO)
    problems = []
    for name in DEMO:
        ev = evaluations[name]
        if not ev.passed:
            problems.append(f"{name}: check failed: {ev.description}")
        elif "parity PASS" not in (ev.description or ""):
            note = getattr(ev.metadata.get("note"), "value", None)
            problems.append(f"{name}: dual materialisation but the arms were not compared: {note}")
        else:
            last = rt.ledger.parity_log.last_parity(name)
            assert last is not None and last.passed and last.pg_count == last.iceberg_count

    # corrupt one legacy row of a dataset, then run only its parity check
    key = pg_docs(pg_db_url, "active_products")[0][1]
    assert key is not None
    corrupt_pg_row(pg_db_url, "active_products", key, "name", "tampered")
    checks_only = dg.define_asset_job(
        "active_products_parity_only",
        selection=dg.AssetSelection.checks_for_assets(dg.AssetKey("active_products")),
    )
    with_job = dg.Definitions.merge(defs, dg.Definitions(jobs=[checks_only]))
    result = with_job.resolve_job_def("active_products_parity_only").execute_in_process(
        instance=instance, raise_on_error=False
    )
    evaluation = check_evals(result)["active_products"]
    assert not evaluation.passed
    meta = {k: getattr(v, "value", v) for k, v in evaluation.metadata.items()}
    expected_key: Any = int(key) if key.lstrip("-").isdigit() else key
    assert meta["only_in_pg"] == [expected_key], meta
    assert meta["only_in_iceberg"] == [expected_key], meta
    assert not problems, "\n".join(problems)
