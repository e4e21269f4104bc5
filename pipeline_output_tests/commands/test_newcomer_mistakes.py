"""A newcomer's mistakes (issue 32), as real `pipeline-output` processes in their own project
(`user_project.py`, one project and database for the module): a Delta over a source declared
without a watermark, or watching another column, works as the Delta declares; a watermark column
the table lacks fails at the first tick in one line naming the dataset and the column; a Delta
over no source of the location fails when the location loads; a data error is one line while
the other assets still materialise. Never exit 0 having planned nothing, never a traceback.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import polars as pl
import psycopg
import pytest

from pipeline_output_tests.commands import user_project as up
from pipeline_output_tests.commands.cli_runner import Run, isolated_env, runner
from pipeline_output_tests.oracle import assert_same_multiset

MOVED = 5  # orders whose updated_at moves on (their created_at does not)


@dataclass
class Project:
    root: Path
    url: str
    home: Path
    cli: Run


@pytest.fixture(scope="module")
def project(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    tmp = tmp_path_factory.mktemp("mistakes")
    with up.project_database(pg_url) as url:
        root = up.make_project(tmp / "orders-project", url)
        yield Project(root, url, tmp / "home", runner(env=isolated_env(tmp, url), cwd=root))


def one_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The single `error:` line of a failed command (no traceback, exit `code`)."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _summary_line(text: str, dataset: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(f"{dataset} "))


def test_a_delta_works_as_declared_whatever_watermark_its_source_declares(
    project: Project,
) -> None:
    first = up.ok(project.cli("materialize", "-m", "orders_pipeline.variants"))
    for dataset in ("plain_changes", "created_changes"):
        assert _summary_line(first, dataset)[6:8] == ["350", "350"], first  # in, ins
    # orders change later: only their updated_at (the Delta's column) moves, not created_at
    later = up.START + timedelta(days=50)
    with psycopg.connect(project.url, autocommit=True) as conn:
        conn.execute(
            "UPDATE public.orders SET updated_at = %s, amount = amount + 1 WHERE order_id <= %s",
            (later, MOVED),
        )
    second = up.ok(project.cli("materialize", "-m", "orders_pipeline.variants"))
    for dataset in ("plain_changes", "created_changes"):
        line = _summary_line(second, dataset)
        assert line[6] == str(MOVED), second  # the new window holds exactly the moved orders
        assert f"{later.isoformat()}]: 1 applied" in " ".join(line), second
    with psycopg.connect(project.url) as conn:
        rows = conn.execute("SELECT order_id, updated_at FROM public.orders").fetchall()
    source = pl.DataFrame(rows, schema=["order_id", "updated_at"], orient="row")
    with up.catalog(project.home, project.url) as cat:
        for dataset in ("plain_changes", "created_changes"):
            table = pl.from_arrow(cat.load_table(f"datasets.{dataset}").scan().to_arrow())
            assert isinstance(table, pl.DataFrame)
            got = table.select("order_id", pl.col("updated_at").dt.convert_time_zone("UTC"))
            expected = source.with_columns(pl.col("updated_at").dt.convert_time_zone("UTC"))
            assert_same_multiset(got, expected)


def test_a_watermark_column_the_table_lacks_fails_at_the_first_tick_naming_it(
    project: Project,
) -> None:
    proc = project.cli("materialize", "-m", "orders_pipeline.missing_column")
    error = one_error(proc, 1)
    assert error.startswith("error: modified_orders: windows not planned: "), error
    assert "Delta(watermark='modified_at')" in error and "no watermark column" in error, error
    assert _summary_line(proc.stdout, "modified_orders")[-4:] == [
        "failed",
        "windows",
        "not",
        "planned",
    ], proc.stdout


def test_a_delta_over_no_source_of_the_location_fails_when_it_loads(project: Project) -> None:
    for command in (("plan",), ("dev",)):
        proc = project.cli(*command, "-m", "orders_pipeline.unknown_source")
        error = one_error(proc, 2)
        assert error.startswith(
            "error: dataset 'typo_changes': Delta(source='orders_typo') is neither a source nor "
            "a dataset of this code location"
        ), error
        assert proc.stdout == "", proc.stdout  # nothing planned, nothing run


def test_a_data_error_is_one_line_and_the_other_assets_still_materialise(
    project: Project,
) -> None:
    proc = project.cli("materialize", "-m", "orders_pipeline.duplicates")
    error = one_error(proc, 1)
    assert error.startswith("error: dataset 'doubled': "), error
    assert "primary key(s) appear more than once" in error, error
    assert _summary_line(proc.stdout, "doubled")[2:] == [
        "-",
        "-",
        "failed",
        "its",
        "step",
        "failed",
    ]
    regions = _summary_line(proc.stdout, "regions")
    assert regions[1:3] == ["iceberg", "iceberg"] and "ok" in regions, proc.stdout
    with up.catalog(project.home, project.url) as cat:
        assert not cat.table_exists("datasets.doubled"), "nothing written"
        assert cat.table_exists("datasets.regions")
