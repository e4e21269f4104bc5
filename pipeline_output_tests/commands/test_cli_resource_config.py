"""A `PipelineOutputResource`'s configuration, from a user project in tmp_path (issue 42):

- a mistake in its `pg_url` or catalog `uri` (a database that does not exist, a wrong role) is a
  configuration error on every route: `error: <field or its EnvVar>: ...`, exit 2, one line with
  no SQLAlchemy "Background" link and no password — as the same mistake in the environment's
  PIPELINE_OUTPUT_PG_URL / PYICEBERG_CATALOG__DEFAULT__URI; inside a Dagster run the step's
  failure is that line too. A server that is down is retryable (exit 75) on both routes.
- its explicit catalog is opened with exactly its properties: `PYICEBERG_CATALOG__DEFAULT__*`
  junk in the environment does not reach a write and read through a real REST catalog
  (SeaweedFS).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pipeline_output.infra.settings import to_sqlalchemy_url, with_database
from pipeline_output_tests.commands.cli_runner import Run, isolated_env, runner
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.processes import free_port
from pipeline_output_tests.seaweed import SeaweedFS, unique_namespace

PYPROJECT = """\
[project]
name = "helpdesk"
version = "0.1.0"

[tool.dagster]
module_name = "helpdesk.definitions"
"""

DATASETS = '''\
import polars as pl

from pipeline_output import dataset


@dataset(primary_key="id", mode="iceberg")
def tickets() -> pl.DataFrame:
    return pl.DataFrame({"id": [1, 2, 3], "status": ["open", "closed", "open"]})


@dataset(primary_key="id", mode="iceberg")
def open_tickets(tickets: pl.LazyFrame) -> pl.LazyFrame:
    """Reads `tickets` back through the resource's catalog."""
    return tickets.filter(pl.col("status") == "open")
'''

# the resource's fields as EnvVars (errors name the variable)
DEFINITIONS = """\
import dagster as dg

from pipeline_output import PipelineOutputResource, build_definitions

from helpdesk.datasets import open_tickets, tickets

defs = build_definitions(
    datasets=[tickets, open_tickets],
    resource=PipelineOutputResource(
        pg_url=dg.EnvVar("HELPDESK_PG"),
        catalog={"type": "sql", "uri": dg.EnvVar("HELPDESK_CATALOG"), "warehouse": WAREHOUSE},
        namespace="helpdesk",
    ),
)
"""

# the resource's fields as values, read by the module (errors name the field)
LITERAL = """\
import json
import os

from pipeline_output import PipelineOutputResource, build_definitions

from helpdesk.datasets import open_tickets, tickets

defs = build_definitions(
    datasets=[tickets, open_tickets],
    resource=PipelineOutputResource(
        pg_url=os.environ["HELPDESK_PG"],
        catalog=json.loads(os.environ["HELPDESK_CATALOG_JSON"]),
        namespace=os.environ.get("HELPDESK_NAMESPACE", "helpdesk"),
    ),
)
"""

# no resource: the environment's settings
ENVIRONMENT = """\
from pipeline_output import build_definitions

from helpdesk.datasets import open_tickets, tickets

defs = build_definitions(datasets=[tickets, open_tickets])
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("helpdesk")
    (root / "pyproject.toml").write_text(PYPROJECT)
    package = root / "helpdesk"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "datasets.py").write_text(DATASETS)
    warehouse = f"file://{root}/warehouse"
    (package / "definitions.py").write_text(DEFINITIONS.replace("WAREHOUSE", repr(warehouse)))
    (package / "literal.py").write_text(LITERAL)
    (package / "environment.py").write_text(ENVIRONMENT)
    return root


@pytest.fixture
def cli(project: Path, tmp_path: Path, pg_db_url: str) -> Run:
    """The CLI from the project's directory; the environment's control plane is a good database
    (Dagster's own run storage), the resource's come from HELPDESK_* per test."""
    return runner(env=isolated_env(tmp_path, pg_db_url), cwd=project, timeout_s=240)


def _one_error_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "sqlalche.me" not in proc.stderr, proc.stderr
    return lines[0]


def _missing(url: str) -> str:
    """`url` naming a database that does not exist, with a password that must never be shown."""
    missing = with_database(url, database="no_such_database")
    scheme, _, rest = missing.partition("://")
    return f"{scheme}://postgres:hunter2@{rest.split('@', 1)[-1]}"


def _down() -> str:
    """A control plane on a port nothing listens on (a server that is down)."""
    return f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/helpdesk?connect_timeout=3"


def _catalog(url: str) -> str:
    return to_sqlalchemy_url(url, driver="psycopg")


def test_a_resource_naming_a_missing_database_is_a_configuration_error_naming_the_env_var(
    cli: Run, pg_db_url: str
) -> None:
    good = {"HELPDESK_PG": pg_db_url, "HELPDESK_CATALOG": _catalog(pg_db_url)}

    line = _one_error_line(cli("status", env={**good, "HELPDESK_PG": _missing(pg_db_url)}), 2)
    assert line.startswith("error: HELPDESK_PG (PipelineOutputResource.pg_url): "), line
    assert '"no_such_database" does not exist' in line and "hunter2" not in line, line

    bad_catalog = {**good, "HELPDESK_CATALOG": _catalog(_missing(pg_db_url))}
    line = _one_error_line(cli("materialize", env=bad_catalog), 2)
    assert line.startswith("error: HELPDESK_CATALOG (PipelineOutputResource.catalog['uri']): ")
    assert '"no_such_database" does not exist' in line and "hunter2" not in line, line


def test_a_resource_given_values_names_its_field(cli: Run, pg_db_url: str) -> None:
    catalog = f'{{"type": "sql", "uri": "{_catalog(_missing(pg_db_url))}", "warehouse": "x"}}'
    env = {"HELPDESK_PG": pg_db_url, "HELPDESK_CATALOG_JSON": catalog}
    line = _one_error_line(cli("status", "-m", "helpdesk.literal", env=env), 2)
    assert line.startswith("error: PipelineOutputResource.catalog['uri']: "), line
    assert '"no_such_database" does not exist' in line and "hunter2" not in line, line


def test_the_same_mistakes_in_the_environment_are_configuration_errors_too(
    cli: Run, pg_db_url: str
) -> None:
    env_route = ("status", "-m", "helpdesk.environment")
    line = _one_error_line(cli(*env_route, env={"PIPELINE_OUTPUT_PG_URL": _missing(pg_db_url)}), 2)
    assert line.startswith("error: PIPELINE_OUTPUT_PG_URL: "), line
    assert '"no_such_database" does not exist' in line and "hunter2" not in line, line

    catalog = {
        "PYICEBERG_CATALOG__DEFAULT__TYPE": "sql",
        "PYICEBERG_CATALOG__DEFAULT__URI": _catalog(_missing(pg_db_url)),
        "PYICEBERG_CATALOG__DEFAULT__WAREHOUSE": "file:///nowhere",
    }
    line = _one_error_line(cli(*env_route, env=catalog), 2)
    assert line.startswith("error: PYICEBERG_CATALOG__DEFAULT__URI: "), line
    assert '"no_such_database" does not exist' in line and "hunter2" not in line, line


def test_a_server_that_is_down_is_retryable_on_both_routes(cli: Run, pg_db_url: str) -> None:
    resource = {"HELPDESK_PG": _down(), "HELPDESK_CATALOG": _catalog(pg_db_url)}
    line = _one_error_line(cli("status", env=resource), 75)
    assert line.startswith("error (retryable): HELPDESK_PG (PipelineOutputResource.pg_url): ")
    assert "hunter2" not in line, line

    environment = {"PIPELINE_OUTPUT_PG_URL": _down()}
    line = _one_error_line(cli("status", "-m", "helpdesk.environment", env=environment), 75)
    assert line.startswith("error (retryable): PIPELINE_OUTPUT_PG_URL: "), line
    assert "hunter2" not in line, line


def test_inside_a_dagster_run_the_failure_is_the_same_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pg_db_url: str
) -> None:
    from pipeline_output import PipelineOutputResource, build_definitions, dataset
    from pipeline_output.dagster_layer.run_report import error_line

    @dataset(primary_key="id", mode="iceberg")
    def tickets() -> pl.DataFrame:
        return pl.DataFrame({"id": [1]})

    monkeypatch.setenv("HELPDESK_RUN_PG", _missing(pg_db_url))
    monkeypatch.setenv("HELPDESK_RUN_CATALOG", _catalog(pg_db_url))
    defs = build_definitions(
        datasets=[tickets],
        resource=PipelineOutputResource(
            pg_url=dg.EnvVar("HELPDESK_RUN_PG"),
            catalog={
                "type": "sql",
                "uri": dg.EnvVar("HELPDESK_RUN_CATALOG"),
                "warehouse": f"file://{tmp_path}/wh",
            },
        ),
    )
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, raise_on_error=False
        )
    failures = [e for e in result.all_events if e.is_step_failure]
    assert failures, "the run did not fail"
    assert failures[0].step_failure_data is not None
    data = failures[0].step_failure_data
    message, retryable = error_line(data.error, data.user_failure_data)
    prefix = "dataset 'tickets': HELPDESK_RUN_PG (PipelineOutputResource.pg_url): "
    assert message.startswith(prefix), message
    assert '"no_such_database" does not exist' in message and "hunter2" not in message
    assert not retryable


def test_dependency_errors_of_a_refused_url_map_to_a_terminal_error_without_sqlalchemys_link(
    pg_db_url: str,
) -> None:
    import psycopg
    import sqlalchemy

    from pipeline_output.errors import PostgresRefused, PostgresUnavailable, from_third_party

    for url, expected in ((_missing(pg_db_url), PostgresRefused), (_down(), PostgresUnavailable)):
        with pytest.raises(psycopg.OperationalError) as raw:
            psycopg.connect(url, connect_timeout=3)
        assert isinstance(from_third_party(raw.value), expected)
        engine = sqlalchemy.create_engine(_catalog(url))
        try:
            with pytest.raises(sqlalchemy.exc.OperationalError) as wrapped:
                engine.connect()
        finally:
            engine.dispose()
        mapped = from_third_party(wrapped.value)
        assert isinstance(mapped, expected), mapped
        assert "sqlalche.me" not in str(mapped) and "hunter2" not in str(mapped), mapped


# --- a resource naming its catalog never needs the environment's catalog config -------------


def test_a_resource_naming_its_catalog_runs_despite_a_malformed_environment_catalog(
    cli: Run, pg_db_url: str, tmp_path: Path
) -> None:
    import json

    broken = {"PYICEBERG_CATALOG__DEFAULT__PY_IO_IMPL": "other.Io"}  # no type, no uri
    catalog = {"type": "sql", "uri": _catalog(pg_db_url), "warehouse": f"file://{tmp_path}/wh"}
    env = {**broken, "HELPDESK_PG": pg_db_url, "HELPDESK_CATALOG_JSON": json.dumps(catalog)}
    proc = cli("materialize", "-m", "helpdesk.literal", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "open_tickets" in proc.stdout and "error" not in proc.stderr, proc.stderr

    # the environment's route uses that catalog: refused up front, as before, naming the setting
    line = _one_error_line(cli("materialize", "-m", "helpdesk.environment", env=broken), 2)
    assert line.startswith("error: PYICEBERG_CATALOG__DEFAULT__URI: "), line
    assert "neither a type nor a uri" in line, line


# --- a resource's explicit catalog reads nothing from the environment (a real REST catalog) ----


@pytest.fixture
def rest_namespace(seaweedfs: SeaweedFS) -> Iterator[str]:
    yield unique_namespace("helpdesk")


def test_a_resources_rest_catalog_ignores_pyiceberg_variables(
    cli: Run, pg_db_url: str, seaweedfs: SeaweedFS, rest_namespace: str
) -> None:
    import json

    junk = {  # the deployment environment's own catalog; merged under the resource's
        # properties, PY_IO_IMPL alone fails the write ("Could not initialize FileIO: other.Io")
        "PYICEBERG_CATALOG__DEFAULT__URI": f"http://127.0.0.1:{free_port()}/elsewhere",
        "PYICEBERG_CATALOG__DEFAULT__PY_IO_IMPL": "other.Io",
        "PYICEBERG_CATALOG__DEFAULT__S3__SESSION_TOKEN": "not-a-token",
        "PYICEBERG_CATALOG__DEFAULT__HEADER__X_ICEBERG_ACCESS_DELEGATION": "remote-signing",
    }
    env = {
        **junk,
        "HELPDESK_PG": pg_db_url,
        "HELPDESK_CATALOG_JSON": json.dumps(seaweedfs.catalog_properties()),
        "HELPDESK_NAMESPACE": rest_namespace,
    }
    proc = cli("materialize", "-m", "helpdesk.literal", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    catalog = seaweedfs.catalog()
    for name, ids in (("tickets", [1, 2, 3]), ("open_tickets", [1, 3])):
        table = catalog.load_table(f"{rest_namespace}.{name}")
        assert table.metadata_location.startswith(seaweedfs.warehouse)
        frame = pl.from_arrow(table.scan(selected_fields=("id",)).to_arrow())
        assert isinstance(frame, pl.DataFrame)
        assert_same_multiset(frame, pl.DataFrame({"id": ids}))
    assert os.environ.get("PYICEBERG_CATALOG__DEFAULT__PY_IO_IMPL") is None  # set for the CLI only


def test_a_rest_catalog_that_refuses_the_credentials_or_is_down_is_one_line_on_both_routes(
    cli: Run, pg_db_url: str, seaweedfs: SeaweedFS, rest_namespace: str
) -> None:
    """A wrong secret is a configuration error (exit 2) saying which settings to check (the
    catalog's when it is refused as it opens); a catalog nobody answers at is retryable (exit
    75): one line each, never pyiceberg's or requests' traceback."""
    import json

    from pipeline_output.infra.settings import env_name

    wrong = dict(seaweedfs.catalog_properties(), **{"client.secret-access-key": "not-it"})
    resource = {"HELPDESK_PG": pg_db_url, "HELPDESK_NAMESPACE": rest_namespace}

    def status(catalog: dict[str, str], code: int) -> str:
        env = {**resource, "HELPDESK_CATALOG_JSON": json.dumps(catalog)}
        return _one_error_line(cli("status", "-m", "helpdesk.literal", env=env), code)

    line = status(wrong, 2)
    # (the server answers its config unsigned: the refusal comes on the first table request,
    # after the catalog opened, so the line names the credentials to check, not a setting)
    assert line.startswith("error: the Iceberg REST catalog refused the request: "), line
    assert "signature" in line and "client.secret-access-key" in line, line
    assert "not-it" not in line, line

    environment = {env_name("default", key): value for key, value in wrong.items()}
    line = _one_error_line(cli("status", "-m", "helpdesk.environment", env=environment), 2)
    assert line.startswith("error: PYICEBERG_CATALOG__DEFAULT__URI: the Iceberg REST catalog"), line

    port = free_port()
    down = dict(seaweedfs.catalog_properties(), uri=f"http://127.0.0.1:{port}")
    line = status(down, 75)
    assert line == (
        "error (retryable): PipelineOutputResource.catalog['uri']: the Iceberg REST catalog at "
        f"http://127.0.0.1:{port} is unreachable: [Errno 111] Connection refused"
    ), line
