"""`PipelineOutputResource`: a code location configured by a typed resource reads nothing from the
environment and starts no embedded server; two locations with different control planes and
catalogs run side by side in one process; a half-configured resource fails when the location
loads, in one line."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from pipeline_output import (
    PipelineOutputResource,
    build_definitions,
    dataset,
)
from pipeline_output.dagster_layer.resource import reset_runtime
from pipeline_output.errors import InvalidArgument
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output.ledger import Ledger
from pipeline_output.services import runtime as runtime_module
from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog
from pipeline_output_tests.dagster_runs import (
    configured_resource,
    failure_errors,
    mat_meta,
    run_assets,
)
from pipeline_output_tests.oracle import assert_same_multiset

ROWS = pl.DataFrame({"order_id": [1, 2, 3], "amount": [9.5, 20.0, 3.25]})


@pytest.fixture
def no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Every PIPELINE_OUTPUT_*/PYICEBERG_* variable unset, no pyiceberg config to find, and the
    settings unreadable: a code path that still asks the environment fails the test."""
    for var in list(os.environ):
        if var.upper().startswith(("PYICEBERG_", "PIPELINE_OUTPUT_")):
            monkeypatch.delenv(var)
    home = tmp_path / "user-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the environment's settings were read")

    monkeypatch.setattr("pipeline_output.infra.settings.get_settings", refuse)
    monkeypatch.setattr("pipeline_output.dagster_layer.resource.get_settings", refuse)
    reset_runtime()
    yield work
    reset_runtime()


def _read(url: str, warehouse: Path, identifier: str) -> pl.DataFrame:
    catalog = FlatSqlCatalog(
        "default", uri=to_sqlalchemy_url(url, driver="psycopg"), warehouse=f"file://{warehouse}"
    )
    try:
        frame = pl.from_arrow(catalog.load_table(identifier).scan().to_arrow())
    finally:
        catalog.engine.dispose()
    assert isinstance(frame, pl.DataFrame)
    return frame


@dataset(primary_key="order_id", mode="iceberg")
def orders() -> pl.DataFrame:
    """Orders."""
    return ROWS


def test_a_location_with_the_resource_materialises_with_no_variable_set(
    no_environment: Path, pg_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_CONTROL_PLANE", pg_db_url)  # a dg.EnvVar, read when the run needs it
    resource = PipelineOutputResource(
        pg_url=dg.EnvVar("SHOP_CONTROL_PLANE"),
        catalog={
            "type": "sql",
            "uri": to_sqlalchemy_url(pg_db_url, driver="psycopg"),
            "warehouse": f"file://{tmp_path}/warehouse",
        },
        namespace="analytics",
    )
    defs = build_definitions(datasets=[orders], resource=resource)
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, ["orders"])
    assert result.success
    meta = mat_meta(result, "orders")
    assert meta["dagster/table_name"] == "default.analytics.orders"
    assert_same_multiset(_read(pg_db_url, tmp_path / "warehouse", "analytics.orders"), ROWS)
    deploy = Ledger(pg_db_url).deploy_log.last_deploy("orders", "iceberg", status="succeeded")
    assert deploy is not None and deploy.run_id == result.run_id
    assert not (no_environment / ".pipeline_output").exists(), "an embedded server was started"


def test_a_runs_first_step_builds_the_runtime_on_a_thread_while_dagster_starts_it(
    no_environment: Path, pg_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster initialises the resource when the step starts: the process's runtime (control
    plane, catalog) is built then on a background thread; the write waits for that build."""
    built_on: list[str] = []
    real = runtime_module.connect

    def connect(**kwargs: Any) -> Any:
        built_on.append(threading.current_thread().name)
        return real(**kwargs)

    monkeypatch.setattr("pipeline_output.dagster_layer.resource.connect", connect)
    resource = configured_resource(pg_db_url, tmp_path / "warehouse", namespace="analytics")
    defs = build_definitions(datasets=[orders], resource=resource)
    with dg.DagsterInstance.ephemeral() as instance:
        assert run_assets(defs, instance, ["orders"]).success
        assert run_assets(defs, instance, ["orders"]).success  # built once per process
    assert built_on == ["po-runtime-warm-up"]
    assert_same_multiset(_read(pg_db_url, tmp_path / "warehouse", "analytics.orders"), ROWS)


def test_a_run_sets_the_resource_up_once_and_its_io_manager_uses_that_one(
    no_environment: Path, pg_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build_definitions` binds the resource so that Dagster initialises it once a run and
    hands the IO manager that very object (not a copy of its own, set up again every run), with
    its `dg.EnvVar` resolved; the location's definitions still answer with the resource."""
    from pipeline_output.dagster_layer.io_manager import DatasetIOManager
    from pipeline_output.dagster_layer.resource import runtime_of_definitions

    monkeypatch.setenv("SHOP_CONTROL_PLANE", pg_db_url)
    setups: list[int] = []
    handed: list[int] = []
    real_setup = PipelineOutputResource.setup_for_execution
    real_handle = DatasetIOManager.handle_output

    def setup(self: PipelineOutputResource, context: dg.InitResourceContext) -> None:
        setups.append(id(self))
        real_setup(self, context)

    def handle(self: DatasetIOManager, context: dg.OutputContext, obj: Any) -> None:
        handed.append(id(self.pipeline_output))
        assert self.pipeline_output.pg_url == pg_db_url  # the variable, resolved
        real_handle(self, context, obj)

    monkeypatch.setattr(PipelineOutputResource, "setup_for_execution", setup)
    monkeypatch.setattr(DatasetIOManager, "handle_output", handle)
    resource = configured_resource(pg_db_url, tmp_path / "warehouse", namespace="analytics")
    resource = PipelineOutputResource(
        pg_url=dg.EnvVar("SHOP_CONTROL_PLANE"), catalog=resource.catalog, namespace="analytics"
    )
    defs = build_definitions(datasets=[orders], resource=resource)
    with dg.DagsterInstance.ephemeral() as instance:
        assert run_assets(defs, instance, ["orders"]).success
    assert len(setups) == 1, setups  # main: 2 (the IO manager's copy set up again)
    assert handed == setups
    assert runtime_of_definitions(defs.resources).namespace == "analytics"
    assert_same_multiset(_read(pg_db_url, tmp_path / "warehouse", "analytics.orders"), ROWS)


def test_a_run_validates_the_resources_config_once_and_still_takes_its_run_config(
    no_environment: Path, pg_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster copies the resource and the IO manager several times a run (binding nested
    resources, the init context, the run's config): a copy that changes no field is not
    constructed — its config schema inferred and its fields validated — again. A run's config
    for the resource still reaches the write, the IO manager's resource included."""
    from pipeline_output.dagster_layer.io_manager import DatasetIOManager

    built: list[str] = []
    namespaces: list[str | None] = []
    real_resource_init = PipelineOutputResource.__init__
    real_manager_init = DatasetIOManager.__init__
    real_handle = DatasetIOManager.handle_output

    def resource_init(self: PipelineOutputResource, **data: Any) -> None:
        built.append("resource")
        real_resource_init(self, **data)

    def manager_init(self: DatasetIOManager, **data: Any) -> None:
        built.append("io manager")
        real_manager_init(self, **data)

    def handle(self: DatasetIOManager, context: dg.OutputContext, obj: Any) -> None:
        namespaces.append(self.pipeline_output.namespace)
        real_handle(self, context, obj)

    defs = build_definitions(
        datasets=[orders],
        resource=configured_resource(pg_db_url, tmp_path / "warehouse", namespace="one"),
    )
    with dg.DagsterInstance.ephemeral() as instance:
        assert run_assets(defs, instance, ["orders"]).success
        monkeypatch.setattr(PipelineOutputResource, "__init__", resource_init)
        monkeypatch.setattr(DatasetIOManager, "__init__", manager_init)
        monkeypatch.setattr(DatasetIOManager, "handle_output", handle)
        assert run_assets(defs, instance, ["orders"]).success
        per_run = list(built)
        built.clear()
        other = {"resources": {"pipeline_output": {"config": {"namespace": "two"}}}}
        assert run_assets(defs, instance, ["orders"], run_config=other).success
    # main: 4 constructions of the resource and 3 of the IO manager a run
    assert per_run == ["resource", "io manager"], per_run
    assert built == per_run, built
    assert namespaces == ["one", "two"], namespaces
    assert_same_multiset(_read(pg_db_url, tmp_path / "warehouse", "two.orders"), ROWS)


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A control plane that accepts connections and never answers (a server hung or behind a
    black hole): a connection attempt waits out its connect timeout. Yields its URL and the
    connections it accepted."""
    accepted: list[socket.socket] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    def serve() -> None:
        with suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"postgresql://po@127.0.0.1:{port}/po", accepted
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def test_a_run_against_a_silent_control_plane_waits_out_one_connect_timeout_not_two(
    no_environment: Path, silent_server: tuple[str, list[socket.socket]], tmp_path: Path
) -> None:
    """The step's write waits for the runtime the step's start began building on a thread and
    takes its error: one connection attempt, one connect timeout, then the one-line error (it
    used to build the runtime again when the warm-up failed: twice the timeout)."""
    url, accepted = silent_server
    defs = build_definitions(
        datasets=[orders],
        resource=configured_resource(url, tmp_path / "warehouse", namespace="analytics"),
    )
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, ["orders"], raise_on_error=False)
    assert not result.success
    assert failure_errors(result) == ["PostgresUnavailable"]
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.step_failure_data.error
    assert error is not None and error.cause is None, "one line: no chained cause"
    assert "\n" not in error.message.strip() and "127.0.0.1" in error.message
    assert len(accepted) == 1, f"{len(accepted)} connection attempts"


def test_a_step_whose_settings_are_unreadable_fails_once_and_its_hook_does_not(
    runtime_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step fails in one line naming the setting; its failure hook finds nothing staged (no
    runtime was built) instead of failing a second time on the same setting."""
    monkeypatch.setenv("PIPELINE_OUTPUT_NAMESPACE", "not a namespace")
    reset_runtime()
    defs = build_definitions(datasets=[orders], resource=PipelineOutputResource())
    try:
        with dg.DagsterInstance.ephemeral() as instance:
            result = run_assets(defs, instance, ["orders"], raise_on_error=False)
    finally:
        reset_runtime()
    assert not result.success
    kinds = [e.event_type_value for e in result.all_events]
    assert "STEP_FAILURE" in kinds and "HOOK_ERRORED" not in kinds, kinds
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "PIPELINE_OUTPUT_NAMESPACE" in str(failure.step_failure_data.error)


def test_two_code_locations_with_different_control_planes_and_catalogs_run_side_by_side(
    no_environment: Path, pg_db_url: str, other_db_url: str, tmp_path: Path
) -> None:
    """The same namespace and dataset name in both: were the catalogs one, the tables would be."""

    @dataset(name="orders", primary_key="order_id", mode="iceberg")
    def eu_orders() -> pl.DataFrame:
        return ROWS.head(2)

    @dataset(name="orders", primary_key="order_id", mode="dual")
    def us_orders() -> pl.DataFrame:
        return ROWS.tail(1)

    eu = build_definitions(
        datasets=[eu_orders],
        resource=configured_resource(pg_db_url, tmp_path / "eu", namespace="shop"),
    )
    us = build_definitions(
        datasets=[us_orders],
        resource=configured_resource(
            other_db_url, tmp_path / "us", namespace="shop", default_mode="pg"
        ),
    )
    with dg.DagsterInstance.ephemeral() as instance:
        assert run_assets(eu, instance, ["orders"]).success
        us_run = run_assets(us, instance, ["orders"])
        assert us_run.success
        assert run_assets(eu, instance, ["orders"]).success  # the first location again

    assert_same_multiset(_read(pg_db_url, tmp_path / "eu", "shop.orders"), ROWS.head(2))
    assert_same_multiset(_read(other_db_url, tmp_path / "us", "shop.orders"), ROWS.tail(1))
    assert mat_meta(us_run, "orders")["dagster/uri"].startswith(f"file://{tmp_path}/us/")
    assert Ledger(pg_db_url).deploy_log.last_deploy("orders", "pg") is None
    for arm in ("pg", "iceberg"):  # the second location's ledger holds both of its arms
        deploy = Ledger(other_db_url).deploy_log.last_deploy("orders", arm, status="succeeded")
        assert deploy is not None and deploy.run_id == us_run.run_id
    eu_deploys = Ledger(pg_db_url).deploy_log.deploys("orders")  # the rerun was a no-op
    assert [d.arm for d in eu_deploys] == ["iceberg"] and eu_deploys[0].run_id != us_run.run_id


def test_a_half_configured_resource_fails_when_the_location_loads(no_environment: Path) -> None:
    with pytest.raises(InvalidArgument) as caught:
        build_definitions(
            datasets=[orders], resource=PipelineOutputResource(pg_url="postgresql://db/x")
        )
    message = str(caught.value)
    assert "\n" not in message
    assert "pg_url is set but catalog is not" in message


def test_an_unknown_default_mode_fails_when_the_location_loads(no_environment: Path) -> None:
    with pytest.raises(InvalidArgument, match="default_mode 'both'"):
        build_definitions(datasets=[orders], resource=PipelineOutputResource(default_mode="both"))


def test_without_pg_url_the_resource_overrides_the_environments_namespace(
    runtime_env: Any, tmp_path: Path
) -> None:
    """The zero-config resource: the environment's settings, `namespace` winning over
    PIPELINE_OUTPUT_NAMESPACE (what a Component's `namespace:` does)."""
    os.environ["PIPELINE_OUTPUT_NAMESPACE"] = "from_env"
    try:
        defs = build_definitions(
            datasets=[orders], resource=PipelineOutputResource(namespace="from_attr")
        )
        with dg.DagsterInstance.ephemeral() as instance:
            result = run_assets(defs, instance, ["orders"])
    finally:
        del os.environ["PIPELINE_OUTPUT_NAMESPACE"]
    assert mat_meta(result, "orders")["dagster/table_name"] == "default.from_attr.orders"
