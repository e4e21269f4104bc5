"""The CLI serves the user's own code location (issue 12): a project in `tmp_path` — not the demo —
driven through plan, materialize, status, windows, windows restate, flip, parity and drain as real
processes, chosen by `-m`, `-f`, `-w`, `PIPELINE_OUTPUT_DEFINITIONS` and `[tool.dagster]` /
`[tool.dg]`; the demo is only the fallback, and is never seeded for a user's location."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal

from pipeline_output.contract.windows import Window
from pipeline_output_tests.commands.cli_runner import Run, isolated_env, runner

USER_DEFS = """
import polars as pl

from pipeline_output import Delta, build_definitions, dataset, postgres_source

tickets_raw = postgres_source("tickets_raw", table="tickets", schema="public", watermark="seq")


@dataset(primary_key="ticket_id", mode="dual", delta=Delta(source="tickets_raw", watermark="seq"))
def tickets(tickets_raw: pl.LazyFrame) -> pl.LazyFrame:
    return tickets_raw.select("ticket_id", "seq", pl.col("status").str.to_uppercase())


@dataset(primary_key="status", strategy="sync")
def ticket_counts(tickets: pl.LazyFrame) -> pl.LazyFrame:
    return tickets.group_by("status").agg(pl.len().cast(pl.Int64).alias("n"))


defs = build_definitions(datasets=[tickets, ticket_counts], sources=[tickets_raw])
"""

TICKETS = [(1, 1, "open"), (2, 2, "closed"), (3, 3, "open"), (4, 4, "pending")]


@pytest.fixture
def project(tmp_path: Path, pg_db_url: str) -> Path:
    """A user's project: package `helpdesk` (defs in `helpdesk/definitions.py`), no pyproject."""
    root = tmp_path / "project"
    (root / "helpdesk").mkdir(parents=True)
    (root / "helpdesk" / "__init__.py").write_text("")
    (root / "helpdesk" / "definitions.py").write_text(USER_DEFS)
    with psycopg.connect(pg_db_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.tickets (ticket_id bigint PRIMARY KEY, seq bigint NOT NULL, "
            "status text NOT NULL)"
        )
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO public.tickets VALUES (%s, %s, %s)", TICKETS)
    return root


@pytest.fixture
def cli(tmp_path: Path, pg_db_url: str, project: Path) -> Run:
    return runner(env=isolated_env(tmp_path, pg_db_url), cwd=project)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _legacy_rows(url: str, dataset: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pipeline_output.dataset_rows WHERE dataset_id = %s", (dataset,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _demo_seeded(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT to_regclass('shop.customers') IS NOT NULL").fetchone()
    return bool(row and row[0])


def test_every_command_serves_a_user_module_given_with_dash_m(
    cli: Run, pg_db_url: str, tmp_path: Path
) -> None:
    m = ("-m", "helpdesk.definitions")
    planned = _ok(cli("plan", *m))
    assert "tickets [iceberg, mode dual" in planned and "tickets [pg, mode dual" in planned
    assert "ticket_counts [pg, mode pg from project default]" in planned

    materialized = _ok(cli("materialize", *m))
    assert "demo shop" not in materialized  # a user's location is never seeded with the demo
    assert not _demo_seeded(pg_db_url)
    assert "tickets" in materialized and "ticket_counts" in materialized

    listed = _ok(cli("windows", *m, "tickets"))
    applied = [line for line in listed.splitlines() if "applied" in line]
    assert len(applied) == 1, listed
    assert "(-inf, 4]" in applied[0], listed
    window = Window(low=None, high=4).to_key()
    restated = _ok(cli("windows", "restate", "tickets", window, *m))
    assert f"window 1 (-inf, 4] restated (partition {window}," in restated

    status = _ok(cli("status", *m))
    rows = {line.split()[0]: line for line in status.splitlines()[1:]}
    assert set(rows) == {"tickets", "ticket_counts"}, status
    assert rows["tickets"].split().count("4") >= 2, status  # 4 rows on each arm (dual)

    parity = _ok(cli("parity", "tickets", *m))
    assert "tickets" in parity
    flipped = _ok(cli("flip", "tickets", "iceberg", "--who", "ops", *m))
    assert re.search(r"^tickets: dual \(declared\) -> iceberg by ops at ", flipped), flipped
    assert _legacy_rows(pg_db_url, "tickets") == 4
    drained = _ok(cli("drain", "tickets", *m))
    assert "drained 4 legacy row(s)" in drained
    assert _legacy_rows(pg_db_url, "tickets") == 0

    # the tables hold what plain polars computes from the source
    from pyiceberg.catalog.sql import SqlCatalog

    from pipeline_output.infra.settings import to_sqlalchemy_url

    catalog = SqlCatalog(
        "default",
        uri=to_sqlalchemy_url(pg_db_url, driver="psycopg"),
        warehouse=f"file://{tmp_path}/home/warehouse",
    )
    got = pl.from_arrow(catalog.load_table("datasets.tickets").scan().to_arrow())
    assert isinstance(got, pl.DataFrame)
    expected = pl.DataFrame(
        {
            "ticket_id": [t[0] for t in TICKETS],
            "seq": [t[1] for t in TICKETS],
            "status": [t[2].upper() for t in TICKETS],
        }
    )
    assert_frame_equal(got.sort("ticket_id"), expected, check_dtypes=False)


def test_python_file_workspace_env_and_pyproject_select_the_code_location(
    cli: Run, project: Path, tmp_path: Path
) -> None:
    defs_file = project / "helpdesk" / "definitions.py"
    by_file = _ok(cli("plan", "ticket_counts", "-f", str(defs_file), cwd=tmp_path))
    assert "ticket_counts [pg" in by_file

    workspace = tmp_path / "ws" / "workspace.yaml"
    workspace.parent.mkdir()
    workspace.write_text(
        f"load_from:\n  - python_module:\n      module_name: helpdesk.definitions\n"
        f"      working_directory: {project}\n"
    )
    by_workspace = _ok(cli("plan", "tickets", "-w", str(workspace), cwd=tmp_path))
    assert "tickets [iceberg" in by_workspace

    env = {"PIPELINE_OUTPUT_DEFINITIONS": "helpdesk.definitions:defs"}
    assert "ticket_counts [pg" in _ok(cli("plan", "ticket_counts", env=env))

    (project / "pyproject.toml").write_text(
        '[tool.dagster]\nmodule_name = "helpdesk.definitions"\n'
    )
    sub = project / "helpdesk"
    assert "tickets [iceberg" in _ok(cli("plan", "tickets", cwd=sub))  # nearest pyproject, upward

    (project / "pyproject.toml").write_text('[tool.dg.project]\nroot_module = "helpdesk"\n')
    assert "tickets [iceberg" in _ok(cli("plan", "tickets"))

    # the command line wins over the environment, which wins over pyproject
    demo = _ok(cli("plan", "daily_revenue", "-m", "pipeline_output.definitions", env=env))
    assert "daily_revenue [iceberg" in demo
    wrong_env = {"PIPELINE_OUTPUT_DEFINITIONS": "pipeline_output.definitions"}
    assert "unknown dataset 'tickets'" in cli("plan", "tickets", env=wrong_env).stderr


def test_without_a_code_location_the_demo_is_served_and_user_datasets_are_unknown(
    cli: Run, tmp_path: Path
) -> None:
    proc = cli("status", cwd=tmp_path)  # tmp_path has no pyproject.toml: the demo
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith("customers") for line in proc.stdout.splitlines())
    unknown = cli("parity", "tickets", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "unknown dataset 'tickets'" in unknown.stderr
    assert "pipeline_output.definitions" in unknown.stderr  # names the location it looked in
    assert "Traceback" not in unknown.stderr


def test_a_bad_code_location_is_one_line_naming_it(cli: Run, tmp_path: Path) -> None:
    missing = cli("status", "-m", "no_such_project.defs", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "no_such_project" in missing.stderr
    both = cli("status", "-m", "a", "-f", "b.py", cwd=tmp_path)
    assert both.returncode == 2 and "give one of -m, -f, -w" in both.stderr
    bad_env = cli("status", cwd=tmp_path, env={"PIPELINE_OUTPUT_DEFINITIONS": "not a module"})
    assert bad_env.returncode == 2 and "PIPELINE_OUTPUT_DEFINITIONS" in bad_env.stderr


def test_user_code_raising_while_the_location_loads_is_one_line_naming_its_line(
    cli: Run, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.py"
    calls.write_text(
        "import dagster as dg\n"
        "from pipeline_output import build_definitions\n\n"
        "@dg.definitions\n"
        "def defs() -> dg.Definitions:\n"
        "    return build_definitions([])\n"
    )
    raised = cli("status", "-f", str(calls), cwd=tmp_path)
    assert raised.returncode == 2 and "Traceback" not in raised.stderr
    assert raised.stderr.count("\n") == 1
    assert f"TypeError at {calls}:6: build_definitions()" in raised.stderr
    imports = tmp_path / "imports.py"
    imports.write_text("import dagster as dg\n\nrate = 1 / 0\n")
    failed = cli("status", "-f", str(imports), cwd=tmp_path)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert f"ZeroDivisionError at {imports}:3: division by zero" in failed.stderr


def test_a_resource_env_var_not_set_is_one_line_naming_the_field_and_nothing_runs(
    cli: Run, tmp_path: Path
) -> None:
    """A `dg.EnvVar` of the bound resource that the environment lacks: Dagster refuses the run's
    config before any step; the CLI says which resource field reads which variable, in one line."""
    defs = tmp_path / "env_defs.py"
    defs.write_text(
        "import dagster as dg\n"
        "import polars as pl\n"
        "from pipeline_output import PipelineOutputResource, build_definitions, dataset\n\n"
        "@dataset(primary_key='id')\n"
        "def orders() -> pl.DataFrame:\n"
        "    return pl.DataFrame({'id': [1, 2]})\n\n"
        "@dg.definitions\n"
        "def defs() -> dg.Definitions:\n"
        "    resource = PipelineOutputResource(namespace=dg.EnvVar('PO_TEST_UNSET_NAMESPACE'))\n"
        "    return build_definitions(datasets=[orders], resource=resource)\n"
    )
    refused = cli("materialize", "-f", str(defs), cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert (
        "resource pipeline_output, field namespace: environment variable "
        "PO_TEST_UNSET_NAMESPACE is not set" in refused.stderr
    )
    assert "runs:" not in refused.stdout  # no run was started
