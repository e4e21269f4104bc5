"""A user module written from the README example (`docs/example_definitions.py`) works outside the
demo: loaded by the `dagster` CLI and in-process, materialised twice, contents equal to an oracle."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from polars.testing import assert_frame_equal

from pipeline_output.infra.settings import Settings

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "example_definitions.py"
README = REPO / "README.md"
DAGSTER = Path(sys.executable).parent / "dagster"

SALES = [  # sale_id, region, quantity, unit_price
    (1, "north", 2, 10.5),
    (2, "south", 1, 99.99),
    (3, "north", 5, 3.2),
    (4, "west", 3, 7.0),
    (5, "south ", 4, 12.25),  # trailing space: kept, it is the user's data
]


def _create_sales(url: str, *, price_type: str = "double precision") -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.sales (sale_id bigint PRIMARY KEY, region text NOT NULL, "
            f"quantity integer NOT NULL, unit_price {price_type} NOT NULL)"
        )
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO public.sales VALUES (%s, %s, %s, %s)", SALES)


def _read_sales(url: str) -> pl.DataFrame:
    """public.sales read with plain psycopg; prices as floats."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT sale_id, region, quantity, unit_price::float8 FROM sales"
        ).fetchall()
    return pl.DataFrame(
        rows,
        schema={
            "sale_id": pl.Int64,
            "region": pl.String,
            "quantity": pl.Int64,
            "unit_price": pl.Float64,
        },
        orient="row",
    )


def _oracle_sales(raw: pl.DataFrame) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "sale_id": raw["sale_id"].to_list(),
            "region": [r.upper() for r in raw["region"]],
            "total": [q * p for q, p in zip(raw["quantity"], raw["unit_price"], strict=True)],
        }
    )


def _oracle_totals(sales: pl.DataFrame) -> pl.DataFrame:
    totals: dict[str, list[float]] = {}
    for region, total in zip(sales["region"], sales["total"], strict=True):
        totals.setdefault(region, []).append(total)
    return pl.DataFrame(
        {
            "region": list(totals),
            "revenue": [sum(v) for v in totals.values()],
            "sales": [len(v) for v in totals.values()],
        }
    )


def _table(catalog: Any, name: str) -> pl.DataFrame:
    frame = pl.from_arrow(catalog.load_table(f"datasets.{name}").scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    return frame


def _assert_rows(got: pl.DataFrame, expected: pl.DataFrame, key: str) -> None:
    assert sorted(got.columns) == sorted(expected.columns)
    assert_frame_equal(
        got.select(expected.columns).sort(key),
        expected.sort(key),
        check_dtypes=False,
        abs_tol=1e-9,
    )


@pytest.fixture
def user_env(settings_env: Settings, pg_db_url: str, catalog: Any) -> Iterator[tuple[str, Any]]:
    from pipeline_output.dagster_layer.resource import reset_runtime

    reset_runtime()
    _create_sales(pg_db_url)
    yield pg_db_url, catalog
    reset_runtime()


def _load_example(tmp_path: Path) -> ModuleType:
    """Import a copy of the example as the user's own module (outside the package)."""
    path = tmp_path / "my_sales_defs.py"
    path.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("my_sales_defs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_example_is_quoted_verbatim_short_complete_and_uses_the_public_api() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    code = text.split('"""\n\n', 1)[1]  # README quotes the file's code, its docstring aside
    assert f"```python\n{code}```" in README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 40
    tree = ast.parse(text)
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported == {"polars", "pipeline_output"}
    assert "defs = build_definitions(" in text


@pytest.mark.slow  # ~60 s on 2 loaded cores: a subprocess per step (multiprocess executor)
def test_user_module_from_the_readme_example_materialises_with_the_dagster_cli(
    user_env: tuple[str, Any], tmp_path: Path
) -> None:
    url, catalog = user_env
    module = tmp_path / "my_sales_defs.py"
    module.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = dict(os.environ, DAGSTER_HOME=str(dagster_home))
    proc = subprocess.run(
        [
            str(DAGSTER),
            "asset",
            "materialize",
            "-f",
            str(module),
            "--select",
            "sales,region_totals",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sales = _oracle_sales(_read_sales(url))
    _assert_rows(_table(catalog, "sales"), sales, "sale_id")
    _assert_rows(_table(catalog, "region_totals"), _oracle_totals(sales), "region")


def test_user_module_redeploy_upserts_sales_and_syncs_region_totals(
    user_env: tuple[str, Any], tmp_path: Path
) -> None:
    url, catalog = user_env
    defs: dg.Definitions = _load_example(tmp_path).defs
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    selection = [dg.AssetKey("sales"), dg.AssetKey("region_totals")]
    first = job.execute_in_process(instance=instance, asset_selection=selection)
    assert first.success
    before = _oracle_sales(_read_sales(url))

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE sales SET region = 'east' WHERE sale_id = 4")  # west disappears
        conn.execute("UPDATE sales SET quantity = 10 WHERE sale_id = 1")
        conn.execute("DELETE FROM sales WHERE sale_id = 2")  # snapshot_replace keeps it
        conn.execute("INSERT INTO sales VALUES (6, 'north', 1, 1.00)")
    second = job.execute_in_process(instance=instance, asset_selection=selection)
    assert second.success

    now = _oracle_sales(_read_sales(url))
    kept = before.join(now, on="sale_id", how="anti")
    expected_sales = pl.concat([now, kept])
    _assert_rows(_table(catalog, "sales"), expected_sales, "sale_id")
    _assert_rows(_table(catalog, "region_totals"), _oracle_totals(expected_sales), "region")

    meta = {
        e.asset_key.to_user_string(): {
            k: getattr(v, "value", v)
            for k, v in e.step_materialization_data.materialization.metadata.items()
        }
        for e in second.get_asset_materialization_events()
    }
    assert meta["sales"]["write_mode"] == "upsert"
    assert (meta["sales"]["rows_inserted"], meta["sales"]["rows_updated"]) == (1, 2)
    assert meta["sales"]["rows_deleted"] == 0
    assert meta["region_totals"]["write_mode"] == "sync"
    assert meta["region_totals"]["rows_deleted"] == 1  # WEST
    assert meta["region_totals"]["rows_inserted"] == 1  # EAST


def test_postgres_numeric_column_reaches_the_compute_as_a_number(
    settings_env: Settings, pg_db_url: str, catalog: Any, tmp_path: Path
) -> None:
    """Money columns are usually `numeric`: the example's arithmetic must work on them too."""
    from pipeline_output.dagster_layer.resource import reset_runtime

    reset_runtime()
    _create_sales(pg_db_url, price_type="numeric(10, 2)")
    defs: dg.Definitions = _load_example(tmp_path).defs
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.ephemeral(),
        asset_selection=[dg.AssetKey("sales")],
        raise_on_error=False,
    )
    errors = [
        e.event_specific_data.error.to_string()  # type: ignore[union-attr]
        for e in result.get_step_failure_events()
    ]
    assert result.success, errors[0][-1500:] if errors else "run failed"
    _assert_rows(_table(catalog, "sales"), _oracle_sales(_read_sales(pg_db_url)), "sale_id")
    reset_runtime()
