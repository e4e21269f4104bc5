"""The CLI serves a code location configured by a `PipelineOutputResource` on the resource's control
plane and catalog, not the environment's: `materialize`, `status` and `flip` run as real
processes while PIPELINE_OUTPUT_PG_URL names another database (which keeps Dagster's own run
storage, and nothing of the datasets)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import polars as pl
import psycopg

from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output.ledger import Ledger
from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog
from pipeline_output_tests.commands.cli_runner import isolated_env, runner
from pipeline_output_tests.oracle import assert_same_multiset

LOCATION = """
import dagster as dg
import polars as pl

from pipeline_output import PipelineOutputResource, build_definitions, dataset


@dataset(primary_key="id", mode="iceberg")
def tickets() -> pl.DataFrame:
    return pl.DataFrame({{"id": [1, 2], "status": ["open", "closed"]}})


defs = build_definitions(
    datasets=[tickets],
    resource=PipelineOutputResource(
        pg_url=dg.EnvVar("HELPDESK_PG"),
        catalog={{"type": "sql", "uri": dg.EnvVar("HELPDESK_CATALOG"), "warehouse": "{warehouse}"}},
        namespace="helpdesk",
    ),
)
"""


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_commands_use_the_locations_resource_not_the_environment(
    tmp_path: Path, pg_db_url: str, other_db_url: str
) -> None:
    warehouse = f"file://{tmp_path}/resource-warehouse"
    location = tmp_path / "helpdesk_defs.py"
    location.write_text(LOCATION.format(warehouse=warehouse))
    env = isolated_env(tmp_path, other_db_url)  # the environment's control plane: another db
    env["HELPDESK_PG"] = pg_db_url
    env["HELPDESK_CATALOG"] = to_sqlalchemy_url(pg_db_url, driver="psycopg")
    cli = runner(env=env, cwd=tmp_path)
    f = ("-f", str(location))

    assert "tickets" in _ok(cli("materialize", *f))
    status = _ok(cli("status", *f))
    assert status.splitlines()[1].split()[0] == "tickets", status
    _ok(cli("flip", "tickets", "dual", "--who", "ops", *f))

    ledger = Ledger(pg_db_url)
    assert ledger.deploy_log.last_deploy("tickets", "iceberg", status="succeeded") is not None
    assert ledger.flip_log.current_flip("tickets") is not None
    with psycopg.connect(other_db_url) as conn:  # the environment's: no ledger at all
        row = conn.execute("SELECT to_regclass('pipeline_output.datasets')").fetchone()
    assert row is not None and row[0] is None
    catalog = FlatSqlCatalog("default", uri=env["HELPDESK_CATALOG"], warehouse=warehouse)
    try:
        frame = pl.from_arrow(catalog.load_table("helpdesk.tickets").scan().to_arrow())
    finally:
        catalog.engine.dispose()
    assert isinstance(frame, pl.DataFrame)
    assert_same_multiset(frame, pl.DataFrame({"id": [1, 2], "status": ["open", "closed"]}))
