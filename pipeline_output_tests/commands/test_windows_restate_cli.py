"""`pipeline-output windows restate` of a user's project (issue 42, item 6), as real processes from
the project's directory: a delta dataset declared with `key_prefix` is restated under its real
asset key, and a window whose partition the CLI's Dagster instance does not know (windows applied
by another instance: a redeploy with new run storage) gets its partition added and is restated."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pipeline_output_tests.commands import user_project as up
from pipeline_output_tests.commands.cli_runner import Run, isolated_env, runner

DEFINITIONS = """\
import polars as pl

from pipeline_output import Delta, build_definitions, dataset, postgres_source

events_raw = postgres_source("events_raw", table="events", watermark="seq")


@dataset(
    primary_key="event_id",
    mode="iceberg",
    key_prefix="marts",
    delta=Delta(source="events_raw", watermark="seq", max_rows=2),
)
def ev_copy(events_raw: pl.LazyFrame) -> pl.LazyFrame:
    return events_raw.select("event_id", "seq", "kind")


defs = build_definitions(datasets=[ev_copy], sources=[events_raw])
"""

PYPROJECT = """\
[project]
name = "events-pipeline"
version = "0.1.0"

[tool.dagster]
module_name = "events_pipeline.definitions"
"""

EVENTS = [(1, 1, "a"), (2, 2, "b"), (3, 3, "c"), (4, 4, "d")]


@dataclass(frozen=True)
class Project:
    cli: Run
    url: str
    home: Path


@pytest.fixture(scope="module")
def project(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """The project materialised once: two windows of `ev_copy` (asset key `marts/ev_copy`)."""
    tmp = tmp_path_factory.mktemp("restate")
    root = tmp / "events-project"
    (root / "events_pipeline").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "events_pipeline" / "__init__.py").write_text("")
    (root / "events_pipeline" / "definitions.py").write_text(DEFINITIONS)
    with up.project_database(pg_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE public.events (event_id bigint PRIMARY KEY, seq bigint NOT NULL, "
                "kind text NOT NULL)"
            )
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO public.events VALUES (%s, %s, %s)", EVENTS)
        cli = runner(env=isolated_env(tmp, url), cwd=root)
        up.ok(cli("materialize"))
        yield Project(cli=cli, url=url, home=tmp / "home")


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout[-2000:] + proc.stderr[-3000:]


def test_restate_of_a_key_prefixed_dataset_runs_its_real_asset_key(project: Project) -> None:
    proc = project.cli("windows", "restate", "ev_copy", "1")
    assert proc.returncode == 0, _one_error_line(proc)
    assert "ev_copy: window 1 " in proc.stdout and " restated (partition " in proc.stdout
    assert "Traceback" not in proc.stderr and "Dagster" not in proc.stderr
    with up.instance(project.home, project.url) as instance:
        import dagster as dg

        event = instance.get_latest_materialization_event(dg.AssetKey(["marts", "ev_copy"]))
    assert event is not None and event.run_id in proc.stdout


def test_restate_adds_a_window_partition_the_instance_does_not_know(project: Project) -> None:
    """Windows applied by another instance (new run storage): the partition is added, the window
    restated, in one run."""
    listed = up.ok(project.cli("windows", "ev_copy"))
    assert "applied" in listed
    with up.instance(project.home, project.url) as instance:
        keys = instance.get_dynamic_partitions("ev_copy__windows")
        assert len(keys) >= 2, keys
        for key in keys:
            instance.delete_dynamic_partition("ev_copy__windows", key)
    proc = project.cli("windows", "restate", "ev_copy", "2")
    assert proc.returncode == 0, _one_error_line(proc)
    assert "ev_copy: window 2 " in proc.stdout and " restated (partition " in proc.stdout
    assert "DagsterUnknownPartitionError" not in proc.stdout + proc.stderr
    with up.instance(project.home, project.url) as instance:
        assert keys[1] in instance.get_dynamic_partitions("ev_copy__windows")
