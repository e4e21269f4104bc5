"""Shared fixtures: a real Postgres (embedded or PIPELINE_OUTPUT_TEST_PG_URL), a fresh database per
test, a pyiceberg SQL catalog on it, and an environment that `get_settings()` resolves against.

No mocks: every fixture hands out real servers, databases and catalogs, and removes them after.
`seaweedfs` (pipeline_output_tests/seaweed.py): a real S3 server and Iceberg REST catalog.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from psycopg import sql
from pyiceberg.exceptions import NoSuchTableError

from pipeline_output.infra import embedded_pg
from pipeline_output.infra.settings import Settings, get_settings, to_sqlalchemy_url, with_database
from pipeline_output_tests.seaweed import (  # noqa: F401  (the SeaweedFS fixture, see there)
    SeaweedFS,
    rest_variant_marks,
    seaweedfs,
)

if TYPE_CHECKING:
    from pipeline_output_tests.iceberg_harness import Harness

TEST_PG_URL = "PIPELINE_OUTPUT_TEST_PG_URL"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the package once, as `pip install` does for an installed one: the suite starts
    ~100 processes (CLI, Dagster daemons, run workers) that import it, and with
    PYTHONDONTWRITEBYTECODE set (as on the CI machine) an uncompiled checkout is recompiled in each
    of them (~8 % of a CLI test's time). Only missing or stale files are compiled."""
    import compileall

    import pipeline_output

    compileall.compile_dir(str(Path(pipeline_output.__file__).parent), quiet=1)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """libpq URI of a real Postgres server for the whole session.

    Its data directory lives outside pytest's numbered temp dirs: pytest deletes all but the newest
    three of those, so a concurrent pytest session could delete a running server's data.
    """
    external = os.environ.get(TEST_PG_URL)
    if external:
        yield external
        return
    root = Path(tempfile.mkdtemp(prefix="po-test-pg-"))
    data_dir = root / "data"
    try:
        yield embedded_pg.start(data_dir=data_dir)
    finally:
        embedded_pg.stop(data_dir=data_dir)
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(pg_url: str) -> Iterator[str]:
    """Create a fresh database on the server at `pg_url`, yield its URL, drop it with FORCE after."""
    name = f"t{uuid.uuid4().hex[:12]}"
    admin = with_database(pg_url, database="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(pg_url, database=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def pg_db_url(pg_url: str) -> Iterator[str]:
    """A fresh database on the session server (dropped with FORCE after the test)."""
    yield from fresh_database(pg_url)


@pytest.fixture
def other_db_url(pg_url: str) -> Iterator[str]:
    """A second fresh database on the session server, to compare two independent runs."""
    yield from fresh_database(pg_url)


@pytest.fixture
def catalog_warehouse(tmp_path: Path) -> str:
    """The warehouse `fresh_catalog` writes to: a local directory (a test module may override)."""
    return f"file://{tmp_path}/warehouse"


@pytest.fixture
def catalog_properties() -> dict[str, str]:
    """Extra pyiceberg properties of `fresh_catalog` handles, e.g. FileIO settings (overridable)."""
    return {}


@pytest.fixture
def catalog_backend() -> str:
    """Which catalog `fresh_catalog` hands out: "sql" (the project's SQL catalog on the test
    database, local files) or "rest" (SeaweedFS's Iceberg REST catalog over S3). A test marked
    `both_catalogs` runs on both (`pytest_generate_tests` below)."""
    return "sql"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked `both_catalogs` runs on the SQL catalog and on SeaweedFS's REST catalog over
    S3 (`catalog_backend` "sql" / "rest"; the REST variant slow unless marked `rest_default`)."""
    marked = metafunc.definition.get_closest_marker("both_catalogs")
    if marked and "catalog_backend" in metafunc.fixturenames:  # a test without a catalog: once
        rest = pytest.param("rest", id="rest", marks=rest_variant_marks(metafunc.definition))
        metafunc.parametrize("catalog_backend", [pytest.param("sql", id="sql"), rest])


@pytest.fixture
def fresh_catalog(
    request: pytest.FixtureRequest,
    catalog_backend: str,
    pg_db_url: str,
    catalog_warehouse: str,
    catalog_properties: dict[str, str],
) -> Iterator[Callable[[], Any]]:
    """Zero-arg factory of NEW catalog handles on one catalog (same properties), so every handle
    sees other handles' commits. `catalog_backend` "sql": the project's default `FlatSqlCatalog`
    (pyiceberg's SqlCatalog with parsed metadata kept per file location) on the test database;
    "rest": a `RestCatalog` on the session's SeaweedFS, whose `datasets` namespace is emptied and
    dropped after the test (the server is shared by the session)."""
    if catalog_backend == "rest":
        yield from rest_catalogs(request.getfixturevalue("seaweedfs"))
        return
    from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

    handles: list[Any] = []

    def make() -> Any:
        catalog = FlatSqlCatalog(
            "default",
            uri=to_sqlalchemy_url(pg_db_url, driver="psycopg"),
            warehouse=catalog_warehouse,
            **catalog_properties,
        )
        handles.append(catalog)
        return catalog

    yield make
    for handle in handles:
        handle.engine.dispose()


def rest_catalogs(server: SeaweedFS, namespace: str = "datasets") -> Iterator[Callable[[], Any]]:
    """`fresh_catalog` on SeaweedFS: new `RestCatalog` handles; after the test every table of
    `namespace` is purged and the namespace dropped, so the next test starts empty."""
    yield server.catalog
    catalog = server.catalog()
    if not catalog.namespace_exists(namespace):
        return
    for ident in catalog.list_tables(namespace):
        with contextlib.suppress(NoSuchTableError):
            catalog.purge_table(ident)
    catalog.drop_namespace(namespace)


@pytest.fixture
def catalog(fresh_catalog: Callable[[], Any]) -> Any:
    """A catalog handle of `catalog_backend` (the SQL catalog on the test database by default),
    namespace `datasets` created."""
    cat = fresh_catalog()
    cat.create_namespace("datasets")
    return cat


@pytest.fixture
def h(catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str) -> Harness:
    """The Iceberg arm's test harness on `catalog` (a module testing another arm overrides `h`)."""
    from pipeline_output_tests.iceberg_harness import Harness

    return Harness(catalog, fresh_catalog, pg_db_url)


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pg_db_url: str) -> Settings:
    """Environment resolving to home=tmp_path/home, PG=pg_db_url, no pyiceberg config."""
    for var in list(os.environ):
        if var.upper().startswith("PYICEBERG_") or var.startswith("PIPELINE_OUTPUT_"):
            monkeypatch.delenv(var)
    empty = tmp_path / "user-home"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(empty))  # no ~/.pyiceberg.yaml
    monkeypatch.chdir(tmp_path)  # nor one in the working directory
    monkeypatch.setenv("PIPELINE_OUTPUT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIPELINE_OUTPUT_PG_URL", pg_db_url)
    return get_settings()


@pytest.fixture
def runtime_env(settings_env: Settings) -> Iterator[Settings]:
    """`settings_env` with the process runtime rebuilt for it (the control plane migrated), and
    forgotten after the test."""
    from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime

    reset_runtime()
    get_runtime()
    yield settings_env
    reset_runtime()


@pytest.fixture
def env(runtime_env: Settings, pg_db_url: str) -> str:
    """The environment on a fresh database with its runtime; the database's URL (a module that
    needs more set-up overrides it, building on `runtime_env`)."""
    return pg_db_url


@pytest.fixture
def instance() -> Iterator[Any]:
    """An ephemeral Dagster instance (in memory) for the test."""
    import dagster as dg

    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def zone_database(url: str, zone: str) -> None:
    """`ALTER DATABASE ... SET timezone`: every new session on the database starts in `zone`."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET timezone = {}").format(
                sql.Identifier(row[0]), sql.Literal(zone)
            )
        )


@pytest.fixture
def set_server_zone(pg_db_url: str) -> Callable[[str], None]:
    """Set the test database's server TimeZone (new sessions only)."""
    return lambda zone: zone_database(pg_db_url, zone)
