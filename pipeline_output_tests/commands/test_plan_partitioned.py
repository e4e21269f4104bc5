"""`pipeline-output plan` of Dagster-partitioned datasets (issue 42, 12d), from a user's file in
`tmp_path`: a run writes its partitions' slices, so the plan says so — never "replace every
target row" — before the first write and after one partition was written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import dagster as dg

from pipeline_output_tests.commands.cli_runner import Run

DEFS = """
from datetime import date

import dagster as dg
import polars as pl

from pipeline_output import build_definitions, dataset


@dataset(
    primary_key="id",
    strategy="replace",
    mode="iceberg",
    partitions_def=dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-04"),
    partition_column="day",
)
def daily(partition_key: str) -> pl.DataFrame:
    day = date.fromisoformat(partition_key)
    return pl.DataFrame({"id": [day.day], "day": [day]})


@dataset(
    primary_key="id",
    mode="iceberg",
    partitions_def=dg.StaticPartitionsDefinition(["eu", "us"]),
    partition_column="region",
)
def regional(partition_key: str) -> pl.DataFrame:
    return pl.DataFrame({"id": [1], "region": [partition_key]})


defs = build_definitions(datasets=[daily, regional], with_maintenance=False)
"""


def plan_lines(cli: Run, path: Path) -> dict[str, str]:
    proc = cli("plan", "-f", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}


def test_plan_of_a_partitioned_dataset_describes_a_partitions_slice_not_every_row(
    cli: Run, env: str, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    path = tmp_path / "defs.py"
    path.write_text(DEFS)
    day_slice = "each partition's slice (the rows whose day lies in that partition)"

    first = plan_lines(cli, path)
    assert "every target row" not in "".join(first.values())
    assert (
        f"replace (first deploy): the target's first write: the compute's rows of {day_slice}"
        in first["daily"]
    )
    assert first["daily"].endswith("; then each partition: replace")
    assert first["regional"].endswith("; then each partition: sync")

    spec = importlib.util.spec_from_file_location("partitioned_defs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    job = module.defs.resolve_implicit_global_asset_job_def()
    for name, key in (("daily", "2024-01-02"), ("regional", "eu")):
        done = job.execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey(name)], partition_key=key
        )
        assert done.success

    again = plan_lines(cli, path)
    assert "every target row" not in "".join(again.values())
    assert (
        f"replace (per partition): replace the target rows of {day_slice} with the compute's "
        "rows (target: re-deploy, 1 row(s) now)"
    ) in again["daily"]
    assert (
        "sync (per partition): make each partition's slice (the rows whose region lies in that "
        "partition) exactly the compute's rows"
    ) in again["regional"]
