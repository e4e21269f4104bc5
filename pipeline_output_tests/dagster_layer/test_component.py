"""`PipelineOutputComponent` in a `dg` project.

In process: `defs.yaml` attributes build the same definitions `build_definitions` does, and win
over environment variables; a `module:` that does not exist is one line naming the file to
create. With the real `dg` CLI (a project built by hand in `tmp_path`: pyproject `[tool.dg]`,
`defs/shop/defs.yaml`): `dg scaffold defs` in a project without the datasets module writes one
with a working example that `dg check defs` loads (issue 42); `dg list components` and `dg
scaffold defs` find the Component through its registry entry point, `dg check defs` and `dg list
defs` load the project, `dg launch --assets` materialises, and the table is found in the catalog
the attributes name.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest
import yaml

from pipeline_output import PipelineOutputComponent
from pipeline_output.dagster_layer.component import PipelineOutputScaffolder, ScaffoldParams
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog
from pipeline_output_tests.dagster_runs import mat_meta
from pipeline_output_tests.oracle import assert_same_multiset

REPO = Path(__file__).resolve().parents[2]
DG = Path(sys.executable).parent / "dg"
GROUP = "dagster_dg_cli.registry_modules"
TYPE = "pipeline_output.PipelineOutputComponent"
DG_TIMEOUT_S = 300
EXAMPLE = REPO / "docs" / "example_component_defs.yaml"

DATASETS = '''
    """The shop's datasets: a pandas compute and a polars one downstream."""

    import pandas as pd
    import polars as pl

    from pipeline_output import dataset


    @dataset(primary_key="sale_id", mode="iceberg")
    def sales() -> pd.DataFrame:
        """Every sale.

        Columns:
            sale_id: the sale's id
        """
        return pd.DataFrame({"sale_id": [1, 2, 3], "region": ["n", "s", "n"], "total": [2.5, 4.0, 1.5]})


    @dataset(primary_key="region", strategy="sync", mode="iceberg")
    def region_totals(sales: pl.LazyFrame) -> pl.LazyFrame:
        return sales.group_by("region").agg(pl.col("total").sum().alias("revenue"))
'''
SALES = pl.DataFrame({"sale_id": [1, 2, 3], "region": ["n", "s", "n"], "total": [2.5, 4.0, 1.5]})
TOTALS = pl.DataFrame({"region": ["n", "s"], "revenue": [4.0, 4.0]})


def _write_module(root: Path, package: str) -> None:
    (root / package).mkdir(parents=True, exist_ok=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "datasets.py").write_text(textwrap.dedent(DATASETS).lstrip())


# --- in process ---------------------------------------------------------------------------------


def test_defs_yaml_attributes_build_the_location_and_win_over_the_environment(
    env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_module(tmp_path, "shop_inproc")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PIPELINE_OUTPUT_NAMESPACE", "from_env")
    component = PipelineOutputComponent.resolve_from_dict(
        {
            "module": ["shop_inproc.datasets"],
            "namespace": "from_yaml",
            "executor": "in_process",
            "maintenance_schedule_cron": "0 4 * * *",
            "maintenance_sensor_running": True,
            "maintenance_sensor_interval_seconds": 900,
            "health_thresholds": {"max_snapshots": 7},
            "maintenance": {"compact": False, "older_than_hours": 48},
        }
    )
    defs = dg.component_defs(component=component)
    assert defs.get_schedule_def("table_maintenance_schedule").cron_schedule == "0 4 * * *"
    defaults = defs.get_job_def("table_maintenance").run_config
    assert defaults is not None
    config = defaults["ops"]["maintain_tables"]["config"]
    assert (config["compact"], config["older_than_hours"], config["dry_run"]) == (False, 48, False)
    # no delta dataset, no window sensor; the maintenance sensor turned on
    assert {s.name for s in defs.sensors or []} == {"table_maintenance_sensor"}
    sensor = defs.get_sensor_def("table_maintenance_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.minimum_interval_seconds == 900
    with dg.DagsterInstance.ephemeral() as instance:
        job = defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("sales"), dg.AssetKey("region_totals")]
        )
    assert result.success
    assert mat_meta(result, "sales")["dagster/table_name"] == "default.from_yaml.sales"
    table = get_runtime().catalog.load_table("from_yaml.region_totals")
    frame = pl.from_arrow(table.scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    assert_same_multiset(frame, TOTALS)


def test_a_module_that_cannot_be_imported_fails_the_load_naming_it() -> None:
    component = PipelineOutputComponent.resolve_from_dict({"module": "no_such_module_here"})
    with pytest.raises(Exception, match="no_such_module_here"):
        dg.component_defs(component=component)


def test_a_missing_module_is_one_line_naming_the_file_to_create() -> None:
    component = PipelineOutputComponent.resolve_from_dict({"module": "shop_nowhere.datasets"})
    with pytest.raises(Exception) as caught:
        dg.component_defs(component=component)
    assert str(caught.value) == (
        "PipelineOutputComponent: module 'shop_nowhere.datasets' not found; create "
        "shop_nowhere/datasets.py with your @datasets (or name another module in defs.yaml's "
        "`module:`)"
    )
    assert caught.value.__cause__ is None  # not chained to the ModuleNotFoundError's traceback


def test_the_reference_shows_the_example_defs_yaml_the_dg_test_runs() -> None:
    text = EXAMPLE.read_text()
    assert f"```yaml\n{text}```" in (REPO / "docs" / "reference.md").read_text()
    assert yaml.safe_load(text)["attributes"]["module"] == "shopdg.datasets"


def test_the_component_is_registered_for_dg_in_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][GROUP] == {"pipeline_output": "pipeline_output"}
    names = [r.split(">")[0].split("<")[0].split("=")[0] for r in project["dependencies"]]
    assert "dagster-dg-cli" in names


# --- the real dg CLI ----------------------------------------------------------------------------


def _entry_point_shim(root: Path) -> Path | None:
    """When the installed distribution does not carry the entry point yet (an editable install
    made before it was declared), a dist-info that declares exactly pyproject's entry points, on
    the dg processes' path; None when the installed one already registers it."""
    installed = importlib.metadata.entry_points(group=GROUP)
    if any(ep.value == "pipeline_output" for ep in installed):
        return None
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    info = root / "shim" / "pipeline_output_entry_points-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pipeline-output-entry-points\nVersion: 0.0.0\n"
    )
    lines = [f"[{GROUP}]", *(f"{k} = {v}" for k, v in declared[GROUP].items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return info.parent


def _dg(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(DG), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=DG_TIMEOUT_S,
    )
    assert out.returncode == 0, f"dg {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture
def dg_project(tmp_path: Path) -> Path:
    """A dg project as `create-dagster project` lays it out, written by hand."""
    project = tmp_path / "shop"
    (project / "shopdg" / "defs").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [project]
            name = "shopdg"
            version = "0.1.0"
            requires-python = ">=3.11"
            dependencies = ["pipeline-output"]

            [tool.dg]
            directory_type = "project"

            [tool.dg.project]
            root_module = "shopdg"

            [tool.dg.cli.telemetry]
            enabled = false
            """
        ).lstrip()
    )
    (project / "shopdg" / "definitions.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path

            import dagster as dg


            @dg.definitions
            def defs() -> dg.Definitions:
                return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
            """
        ).lstrip()
    )
    (project / "shopdg" / "defs" / "__init__.py").write_text("")
    _write_module(project, "shopdg")  # shopdg/datasets.py: the scaffold's default module
    return project


def _dg_env(tmp_path: Path, pg_db_url: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("PIPELINE_OUTPUT_", "PYICEBERG_", "DAGSTER_"))
    }
    shim = _entry_point_shim(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(shim or "")) if p)
    home = tmp_path / "user-home"
    home.mkdir()
    env["HOME"] = str(home)
    env["SHOP_CONTROL_PLANE"] = pg_db_url
    env["SHOP_CATALOG_URI"] = to_sqlalchemy_url(pg_db_url, driver="psycopg")
    # the attributes win: were these read, the run would go to an unreachable server and the
    # wrong namespace
    env["PIPELINE_OUTPUT_PG_URL"] = "postgresql://nobody@127.0.0.1:9/nowhere"
    env["PIPELINE_OUTPUT_NAMESPACE"] = "not_this_one"
    return env


def test_scaffolding_the_component_writes_an_example_datasets_module_dg_check_defs_loads(
    dg_project: Path, tmp_path: Path, pg_db_url: str
) -> None:
    """`dg scaffold defs` in a project without `<root_module>.datasets` writes that module with a
    working example (issue 42: `dg check defs` used to fail with ~40 lines of traceback)."""
    datasets = dg_project / "shopdg" / "datasets.py"
    datasets.unlink()
    env = _dg_env(tmp_path, pg_db_url)
    env["PIPELINE_OUTPUT_PG_URL"] = pg_db_url  # no pg_url/catalog attributes: the environment's
    env["PIPELINE_OUTPUT_HOME"] = str(tmp_path / "home")
    _dg(dg_project, env, "scaffold", "defs", TYPE, "shop")
    assert "@dataset(" in datasets.read_text()
    checked = _dg(dg_project, env, "check", "defs")
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr


def test_the_scaffolder_writes_the_module_in_the_projects_package_and_never_overwrites(
    tmp_path: Path,
) -> None:
    package = tmp_path / "src" / "shopsrc"
    (package / "defs" / "a").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text('[tool.dg.project]\nroot_module = "shopsrc"\n')

    def scaffold(module: str | None = None) -> None:
        PipelineOutputScaffolder().scaffold(
            dg.ScaffoldRequest(
                type_name=TYPE,
                target_path=package / "defs" / "a",
                scaffold_format="yaml",
                project_root=tmp_path,
                params=ScaffoldParams(module=module),
            )
        )

    scaffold()
    written = package / "datasets.py"
    namespace: dict[str, Any] = {}
    exec(compile(written.read_text(), str(written), "exec"), namespace)  # a working example
    assert spec_of(namespace["example"]) is not None
    written.write_text("# mine\n")
    scaffold()
    assert written.read_text() == "# mine\n"  # never overwritten
    scaffold("elsewhere.datasets")  # a package outside the project: nothing is written
    assert sorted(p.name for p in tmp_path.rglob("*.py")) == ["__init__.py", "datasets.py"]


@pytest.mark.slow
def test_a_dg_project_scaffolds_checks_lists_and_launches_the_component(
    dg_project: Path, tmp_path: Path, pg_db_url: str
) -> None:
    env = _dg_env(tmp_path, pg_db_url)
    listed = json.loads(_dg(dg_project, env, "list", "components", "--json").stdout)
    assert TYPE in [item["key"] for item in listed["items"]]

    _dg(dg_project, env, "scaffold", "defs", TYPE, "shop")
    defs_yaml = dg_project / "shopdg" / "defs" / "shop" / "defs.yaml"
    scaffolded = yaml.safe_load(defs_yaml.read_text())
    assert scaffolded == {"type": TYPE, "attributes": {"module": "shopdg.datasets"}}

    # the reference's defs.yaml (docs/example_component_defs.yaml) in place of the scaffold
    defs_yaml.write_text(EXAMPLE.read_text())
    warehouse = tmp_path / "warehouse"
    env["SHOP_WAREHOUSE"] = f"file://{warehouse}"

    checked = _dg(dg_project, env, "check", "defs")
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    listed_defs: dict[str, Any] = json.loads(_dg(dg_project, env, "list", "defs", "--json").stdout)
    assets = {a["asset_key"]: a for a in listed_defs["assets"]}
    assert set(assets) == {"sales", "region_totals"}
    assert assets["sales"]["kinds"] == ["iceberg"]
    assert {c["key"] for c in listed_defs["asset_checks"]} >= {"sales:parity", "sales:table_health"}

    _dg(dg_project, env, "launch", "--assets", "sales,region_totals")

    catalog = FlatSqlCatalog(
        "default", uri=env["SHOP_CATALOG_URI"], warehouse=f"file://{warehouse}"
    )
    try:
        for name, expected in (("sales", SALES), ("region_totals", TOTALS)):
            frame = pl.from_arrow(catalog.load_table(f"shop.{name}").scan().to_arrow())
            assert isinstance(frame, pl.DataFrame)
            assert_same_multiset(frame, expected)
    finally:
        catalog.engine.dispose()
    assert not (dg_project / ".pipeline_output").exists(), "an embedded server was started"
