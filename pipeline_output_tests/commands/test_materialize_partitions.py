"""`pipeline-output materialize DATASET --partition KEY` / `--partition-range FIRST...LAST` on a
user's file: the Dagster-partitioned dataset is written for those partitions only (a range in
one run), twice with the same rows; a key the dataset lacks, a reversed range or a selection with
no Dagster-partitioned asset is one error line before anything runs."""

from __future__ import annotations

import importlib.util
from datetime import date
from pathlib import Path

import dagster as dg
import polars as pl

from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.dagster_layer.runner import materialize
from pipeline_output_tests.commands.cli_runner import Run
from pipeline_output_tests.oracle import assert_same_multiset

DEFS = """
from datetime import date

import dagster as dg
import polars as pl

from pipeline_output import build_definitions, dataset


@dataset(
    primary_key="id",
    strategy="replace",
    mode="iceberg",
    partitions_def=dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-06"),
    partition_column="day",
)
def daily(partition_key: str) -> pl.DataFrame:
    day = date.fromisoformat(partition_key)
    return pl.DataFrame({"id": [day.day * 10, day.day * 10 + 1], "day": [day, day]})


@dataset(primary_key="id", mode="iceberg")
def plain() -> pl.DataFrame:
    return pl.DataFrame({"id": [1]})


@dataset(
    primary_key="id",
    mode="iceberg",
    partitions_def=dg.DynamicPartitionsDefinition(name="regions"),
    partition_column="region",
)
def regional(partition_key: str) -> pl.DataFrame:
    return pl.DataFrame({"id": [len(partition_key)], "region": [partition_key]})


defs = build_definitions(datasets=[daily, plain, regional], with_maintenance=False)
"""


def _expected(days: list[int]) -> pl.DataFrame:
    """The oracle: what the compute returns for those days of January 2024."""
    return pl.DataFrame(
        {
            "id": [d * 10 + i for d in days for i in (0, 1)],
            "day": [date(2024, 1, d) for d in days for _ in (0, 1)],
        }
    )


def _stored() -> pl.DataFrame:
    return get_runtime().iceberg.read("daily")


def _error(proc: object) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in proc.stderr  # type: ignore[attr-defined]
    lines = proc.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, proc.stderr  # type: ignore[attr-defined]
    return str(lines[0])


def test_materialize_writes_the_partition_and_the_range_given_and_nothing_else(
    cli: Run, env: str, tmp_path: Path
) -> None:
    path = tmp_path / "defs.py"
    path.write_text(DEFS)
    listed = cli("materialize", "daily", "-f", str(path))
    assert listed.returncode == 0, listed.stderr
    assert "not run" in listed.stdout and "--partition KEY" in listed.stdout

    for rerun in (False, True):  # a re-run of the same partitions writes the same rows
        one = cli("materialize", "daily", "--partition", "2024-01-02", "-f", str(path))
        assert one.returncode == 0, one.stdout + one.stderr
        assert_same_multiset(_stored(), _expected([2, 3, 4, 5] if rerun else [2]))

        span = cli(
            "materialize", "daily", "--partition-range", "2024-01-03...2024-01-05", "-f", str(path)
        )
        assert span.returncode == 0, span.stdout + span.stderr
        assert len(set(span.stdout.split("runs: ")[1].split(", "))) == 1  # one run for the range
        assert_same_multiset(_stored(), _expected([2, 3, 4, 5]))


def test_materialize_refuses_a_partition_it_cannot_run_in_one_line_before_any_run(
    cli: Run, env: str, tmp_path: Path
) -> None:
    path = tmp_path / "defs.py"
    path.write_text(DEFS)
    missing = _error(
        cli("materialize", "daily", "plain", "--partition", "2025-01-01", "-f", str(path))
    )
    assert missing == (
        "error: daily has no partition '2025-01-01'; its partitions: 2024-01-01 .. 2024-01-05 (5 keys)"
    )
    reversed_ = _error(
        cli("materialize", "daily", "--partition-range", "2024-01-04...2024-01-02", "-f", str(path))
    )
    assert "'2024-01-04' comes after '2024-01-02'" in reversed_
    unpartitioned = _error(
        cli("materialize", "plain", "--partition", "2024-01-02", "-f", str(path))
    )
    assert "no selected asset has Dagster partitions" in unpartitioned
    both = cli(
        "materialize",
        "daily",
        "--partition",
        "2024-01-02",
        "--partition-range",
        "a...b",
        "-f",
        str(path),
    )
    assert both.returncode == 2 and "not both" in both.stderr
    assert get_runtime().iceberg.load("plain") is None  # nothing ran
    assert get_runtime().iceberg.load("daily") is None


def test_a_dynamic_partition_is_run_when_the_instance_holds_it_and_refused_in_one_line_before(
    cli: Run, env: str, tmp_path: Path
) -> None:
    path = tmp_path / "defs.py"
    path.write_text(DEFS)
    unknown = _error(cli("materialize", "regional", "--partition", "eu", "-f", str(path)))
    assert unknown == "error: regional has no partition 'eu'; its partitions: none yet"

    spec = importlib.util.spec_from_file_location("dynamic_defs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("regions", ["eu", "us"])
        for _ in range(2):  # the runner `materialize` calls, with the keys the instance holds
            report = materialize(
                module.defs, instance, selection=["regional"], partitions=("eu", "eu")
            )
            assert report.ok, report.failures
            assert_same_multiset(
                get_runtime().iceberg.read("regional"), pl.DataFrame({"id": [2], "region": ["eu"]})
            )
