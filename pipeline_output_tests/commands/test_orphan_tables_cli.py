"""A dataset renamed in a newcomer's own project (`user_project.py`) leaves its Iceberg table:
`status` lists it, `doctor` warns, `tables drop` refuses what the code location owns and drops the
orphan (its files and control-plane records with it) — as real processes from the project dir.

One project and one database for the module: `renamed` materializes the project, adds a table
another tool keeps in the namespace, renames `region_totals` to `region_revenue` in the project's
definitions, then runs the commands; the tests check what each printed and left.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from pipeline_output_tests.commands import user_project as up
from pipeline_output_tests.commands.cli_runner import CLI, isolated_env, runner
from pipeline_output_tests.commands.test_newcomer_cli import columns

GONE = "region_totals"  # renamed to region_revenue after the first materialize
FOREIGN = "external_feed"  # created by another tool in the namespace


@dataclass
class Renamed:
    url: str
    home: Path
    out: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    table_dir: Path | None = None  # the orphan table's location
    files_before: int = 0  # files under it before the drop
    records_before: dict[str, int] = field(default_factory=dict)


def records(url: str) -> dict[str, int]:
    """Deploys per dataset in the control plane."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT dataset, count(*) FROM pipeline_output.deploys GROUP BY 1"
        ).fetchall()
    return {str(name): int(n) for name, n in rows}


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    return line


@pytest.fixture(scope="module")
def renamed(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Renamed]:
    tmp = tmp_path_factory.mktemp("orphans")
    with up.project_database(pg_url) as url:
        root = up.make_project(tmp / "orders-project", url)
        state = Renamed(url=url, home=tmp / "home")
        env = isolated_env(tmp, url)
        cli = runner(env=env, cwd=root)
        out = state.out
        up.ok(cli("materialize"))
        with up.catalog(state.home, url) as cat:
            cat.create_table(("datasets", FOREIGN), schema=pa.schema([("id", pa.int64())]))
        definitions = root / up.MODULE / "definitions.py"
        definitions.write_text(definitions.read_text().replace(GONE, "region_revenue"))
        out["status"] = cli("status")
        out["doctor"] = cli("doctor")
        out["owned"] = cli("tables", "drop", "order_changes", "--yes")
        out["foreign"] = cli("tables", "drop", FOREIGN, "--yes")
        out["declined"] = subprocess.run(
            [CLI, "tables", "drop", GONE],
            input="n\n",
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        with up.catalog(state.home, url) as cat:
            location = cat.load_table(("datasets", GONE)).location()
        state.table_dir = Path(location.removeprefix("file://"))
        state.files_before = sum(1 for p in state.table_dir.rglob("*") if p.is_file())
        state.records_before = records(url)
        out["drop"] = cli("tables", "drop", GONE, "--yes")
        out["after"] = cli("status")
        yield state


def test_status_lists_the_renamed_datasets_table_as_an_orphan_after_the_datasets(
    renamed: Renamed,
) -> None:
    text = up.ok(renamed.out["status"])
    board = {row["dataset"]: row for row in columns(text)}
    assert sorted(board) == ["order_changes", "order_scores", "orders", "region_revenue"]
    orphans = [line for line in text.splitlines() if line.startswith("orphan table ")]
    assert len(orphans) == 1, text  # not the delta dataset's table, nor another tool's
    assert orphans[0].startswith(
        f"orphan table datasets.{GONE} (no dataset of this code location; 4 rows, last written "
    ), orphans
    assert orphans[0].endswith(f"drop it: pipeline-output tables drop {GONE}"), orphans


def test_status_shows_no_legacy_rows_for_a_dataset_never_written_to_that_arm(
    renamed: Renamed,
) -> None:
    board = {row["dataset"]: row for row in columns(up.ok(renamed.out["status"]))}
    assert board["order_changes"]["pg rows"] == "-"  # iceberg only: never written there
    assert board["order_changes"]["iceberg rows"] == str(up.ORDER_COUNT)
    assert board["orders"]["pg rows"] == str(up.ORDER_COUNT)  # the legacy arm's dataset


def test_doctor_warns_about_the_orphan_table(renamed: Renamed) -> None:
    text = up.ok(renamed.out["doctor"])
    warnings = [line for line in text.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        line
        for line in warnings
        if line.startswith(f"warning: orphan table datasets.{GONE} (no dataset of")
    ], text
    assert len(warnings) == 1, text
    assert "no orphan data files" in text


def test_tables_drop_refuses_a_table_of_the_code_location_or_of_another_tool(
    renamed: Renamed,
) -> None:
    owned = error_line(renamed.out["owned"])
    assert "datasets.order_changes belongs to dataset 'order_changes'" in owned, owned
    assert "nothing was dropped" in owned
    foreign = error_line(renamed.out["foreign"])
    assert f"datasets.{FOREIGN} was not written by pipeline-output" in foreign, foreign
    declined = renamed.out["declined"]
    assert declined.returncode == 1 and "Aborted!" in declined.stderr, declined.stderr
    assert "dropped" not in declined.stdout
    with up.catalog(renamed.home, renamed.url) as cat:
        assert cat.table_exists(("datasets", "order_changes"))
        assert cat.table_exists(("datasets", FOREIGN))
    assert renamed.records_before.get(GONE), "the declined drop forgot nothing"


def test_tables_drop_purges_the_orphan_and_forgets_its_records_and_status_no_longer_lists_it(
    renamed: Renamed,
) -> None:
    text = up.ok(renamed.out["drop"])
    assert renamed.files_before > 0
    assert text.startswith(f"dropped datasets.{GONE}: {renamed.files_before} file(s), "), text
    assert "control-plane records of 'region_totals' forgotten: " in text and " deploys" in text
    with up.catalog(renamed.home, renamed.url) as cat:
        assert not cat.table_exists(("datasets", GONE))
        assert cat.table_exists(("datasets", "order_changes"))
    assert renamed.table_dir is not None and not renamed.table_dir.exists(), "files removed"
    after = records(renamed.url)
    assert GONE not in after
    assert {k: v for k, v in renamed.records_before.items() if k != GONE} == after
    status = up.ok(renamed.out["after"])
    assert "orphan table" not in status, status


def test_forget_covers_every_control_plane_table_that_names_a_dataset(renamed: Renamed) -> None:
    from pipeline_output.ledger.control_plane import PER_DATASET

    with psycopg.connect(renamed.url) as conn:
        named = conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = "
            "'pipeline_output' AND column_name IN ('dataset', 'dataset_id')"
        ).fetchall()
    assert {str(t) for (t,) in named} | {"datasets"} == {t for t, _ in PER_DATASET}
