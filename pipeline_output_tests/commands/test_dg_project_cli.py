"""A standard `dg` project is served by the CLI (issue 42, items 1 and 2): a project laid out as
`create-dagster project` lays it out, in `tmp_path` (pyproject `[tool.dg] directory_type =
"project"`, `[tool.dg.project] root_module = "shop"`, `src/shop/definitions.py` holding a
`@dg.definitions` function that returns `dg.load_from_defs_folder(...)`, and the Component in
`src/shop/defs/orders/defs.yaml`). `plan`, `materialize`, `status`, `windows` serve it from its
directory (and from below it), `-a` names the attribute of the module the pyproject or
PIPELINE_OUTPUT_DEFINITIONS names, and `dev` serves it under the location name `dg dev` gives it
(the project directory's name) without Dagster's "does not match" warning.
"""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline_output_tests.commands import user_project as up
from pipeline_output_tests.commands.cli_runner import CLI, Run, isolated_env, runner
from pipeline_output_tests.processes import graphql, running_dev

PROJECT_DIR = "shop-project"  # dg names the location after the project's directory

PYPROJECT = """\
[project]
name = "shop"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["pipeline-output"]

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "shop"

[tool.dg.cli.telemetry]
enabled = false
"""

# what `create-dagster project` writes
DEFINITIONS = """\
from pathlib import Path

from dagster import definitions, load_from_defs_folder


@definitions
def defs():
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
"""

DEFS_YAML = """\
type: pipeline_output.PipelineOutputComponent

attributes:
  module: shop.datasets
"""

DATASETS = """\
import polars as pl

from pipeline_output import Delta, dataset, postgres_source

orders_raw = postgres_source("orders_raw", table="orders", watermark="updated_at")


@dataset(
    primary_key="order_id", mode="iceberg", delta=Delta(source="orders_raw", watermark="updated_at")
)
def order_changes(orders_raw: pl.LazyFrame) -> pl.LazyFrame:
    return orders_raw.select("order_id", "region", "amount", "updated_at")


@dataset(primary_key="region", strategy="sync", mode="iceberg")
def region_totals(order_changes: pl.LazyFrame) -> pl.LazyFrame:
    return order_changes.group_by("region").agg(pl.col("amount").sum().alias("revenue"))
"""

LOCATIONS = "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }"


def _write_project(root: Path, datasets: str) -> Path:
    """The project as `create-dagster project` lays it out, its Component's module `datasets`;
    its package directory."""
    package = root / "src" / "shop"
    (package / "defs" / "orders").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS)
    (package / "datasets.py").write_text(datasets)
    (package / "defs" / "__init__.py").write_text("")
    (package / "defs" / "orders" / "defs.yaml").write_text(DEFS_YAML)
    return package


@dataclass
class Project:
    root: Path
    url: str
    home: Path
    env: dict[str, str]
    cli: Run


@pytest.fixture(scope="module")
def project(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    tmp = tmp_path_factory.mktemp("dg-project")
    root = tmp / PROJECT_DIR
    _write_project(root, DATASETS)
    with up.project_database(pg_url) as url:
        up.make_project(tmp / "source-tables", url)  # only for its `public.orders` table
        env = isolated_env(tmp, url)
        yield Project(root, url, tmp / "home", env, runner(env=env, cwd=root))


def _fine(proc: subprocess.CompletedProcess[str]) -> str:
    out = up.ok(proc)
    assert "does not match" not in out + proc.stderr, proc.stderr
    return out


def test_every_command_serves_a_dg_project_whose_definitions_is_a_dg_definitions_function(
    project: Project,
) -> None:
    planned = _fine(project.cli("plan"))
    assert {line.split()[0] for line in planned.splitlines() if line.strip()} >= {
        "order_changes:",
        "region_totals",
    }, planned
    materialized = _fine(project.cli("materialize"))
    assert "order_changes" in materialized and "region_totals" in materialized, materialized
    with up.catalog(project.home, project.url) as cat:
        table = cat.load_table("datasets.order_changes")
        assert table.scan().to_arrow().num_rows == up.ORDER_COUNT
    status = _fine(project.cli("status", cwd=project.root / "src" / "shop" / "defs"))
    assert {"order_changes", "region_totals"} <= {
        line.split()[0] for line in status.splitlines()[1:]
    }, status
    windows = _fine(project.cli("windows", "order_changes"))
    assert "applied" in windows, windows


def test_dash_a_names_the_attribute_of_the_module_the_pyproject_or_the_environment_names(
    project: Project,
) -> None:
    assert "order_changes" in _fine(project.cli("plan", "-a", "defs"))
    in_src = project.root / "src"
    by_env = {"PIPELINE_OUTPUT_DEFINITIONS": "shop.definitions"}
    assert "order_changes" in _fine(project.cli("plan", "-a", "defs", cwd=in_src, env=by_env))
    wrong = project.cli("plan", "-a", "nope")
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert wrong.stderr.strip().splitlines() == [
        "error: code location shop.definitions:nope: no attribute 'nope'"
    ], wrong.stderr


def test_dev_serves_a_dg_project_under_its_dg_location_name_without_a_mismatch_warning(
    project: Project, tmp_path: Path
) -> None:
    log = tmp_path / "dev.log"
    with running_dev(
        [CLI, "dev"], env=project.env, cwd=project.root, log=log, root=project.root.parent
    ) as port:
        entries = graphql(port, LOCATIONS)["workspaceOrError"]["locationEntries"]
    assert "does not match" not in log.read_text(), log.read_text()[-3000:]
    assert [entry["name"] for entry in entries] == [PROJECT_DIR]


def test_a_dg_projects_code_location_name_names_its_dev_location(
    project: Project, tmp_path: Path
) -> None:
    """`[tool.dg.project] code_location_name` wins over the directory's name, as for `dg dev`
    (checked on the workspace `dev` writes, with `dagster` standing in)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "dagster").write_text('#!/bin/sh\ncp "$3" "$FAKE_DAGSTER_OUT"\n')
    (fake_bin / "dagster").chmod(0o755)
    named = tmp_path / "named"
    (named / "shop").mkdir(parents=True)
    (named / "pyproject.toml").write_text(
        PYPROJECT.replace('root_module = "shop"', 'root_module = "shop"\ncode_location_name = "x"')
    )
    (named / "shop" / "__init__.py").write_text("")
    (named / "shop" / "definitions.py").write_text(
        textwrap.dedent(
            """
            import dagster as dg

            @dg.definitions
            def defs():
                return dg.Definitions()
            """
        )
    )
    out = tmp_path / "workspace.yaml"
    env = {"PATH": f"{fake_bin}:{project.env['PATH']}", "FAKE_DAGSTER_OUT": str(out)}
    up.ok(project.cli("dev", cwd=named, env=env))
    assert "location_name: x\n" in out.read_text(), out.read_text()


def test_a_dataset_in_a_plain_defs_folder_is_one_line_saying_how_to_give_it_its_resources(
    tmp_path: Path, pg_db_url: str
) -> None:
    root = tmp_path / PROJECT_DIR
    package = root / "src" / "shop"
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS)
    (package / "defs" / "__init__.py").write_text("")
    (package / "defs" / "sales.py").write_text(
        textwrap.dedent(
            """\
            import polars as pl
            from pipeline_output import dataset

            @dataset(primary_key="id", strategy="snapshot_replace", mode="iceberg")
            def sales() -> pl.DataFrame:
                return pl.DataFrame({"id": [1, 2], "amount": [3.0, 4.5]})
            """
        )
    )
    run = runner(env=isolated_env(tmp_path, pg_db_url), cwd=root)
    result = run("plan")
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "resource with key 'pipeline_output'" in result.stderr
    assert "PipelineOutputComponent" in result.stderr and "build_definitions" in result.stderr


@pytest.mark.parametrize(
    ("datasets", "said"),
    [
        (
            DATASETS.replace('strategy="sync"', 'strategy="upsert"'),
            "error: @dataset 'region_totals' (shop.datasets): unknown strategy 'upsert'; "
            "for 'upsert' use 'snapshot_replace'",
        ),
        (DATASETS + "\nrate = 1 / 0\n", "ZeroDivisionError at {datasets}:"),
    ],
    ids=["a_spec_error", "user_code_raising"],
)
def test_a_component_module_that_does_not_load_is_one_line_about_its_cause(
    project: Project, tmp_path: Path, datasets: str, said: str
) -> None:
    """The Component's module failing to load (our spec error, the user's code raising) reaches
    the CLI wrapped in Dagster's `ComponentTreeException`: the line is about the cause, not the
    wrapper (whose frame was the standard library's `contextlib`)."""
    root = tmp_path / PROJECT_DIR
    package = _write_project(root, datasets)
    failed = runner(env=project.env, cwd=root)("status")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert failed.stderr.count("\n") == 1, failed.stderr
    assert said.format(datasets=package / "datasets.py") in failed.stderr, failed.stderr
    assert "ComponentTreeException" not in failed.stderr
