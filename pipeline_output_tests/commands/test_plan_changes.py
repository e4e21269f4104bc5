"""`pipeline-output plan` of an incremental downstream (issue 46): the upstream changes its next
run would consume — a full refresh before its first run, the range and the counts by change type
after an upstream write, nothing pending once consumed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import dagster as dg
import polars as pl

from pipeline_output_tests.commands.cli_runner import Run

DEFS = """
import polars as pl

from pipeline_output import Changes, build_definitions, dataset

ROWS = {"now": pl.DataFrame({"id": [1, 2], "grp": ["a", "b"], "amount": [1, 2]})}


@dataset(primary_key="id", mode="iceberg")
def orders() -> pl.DataFrame:
    return ROWS["now"]


@dataset(primary_key="grp", strategy="sync", mode="iceberg")
def totals(orders: Changes) -> pl.DataFrame:
    now = orders.current.join(orders.keys("grp").lazy(), on="grp", how="semi")
    return orders.with_deletions(now.group_by("grp").agg(pl.col("amount").sum()), "grp")


defs = build_definitions(datasets=[orders, totals], with_maintenance=False)
"""


def _plan(cli: Run, path: Path) -> list[str]:
    proc = cli("plan", "-f", str(path), "totals")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout.splitlines()


def _pending(cli: Run, path: Path) -> str:
    return next(line for line in _plan(cli, path) if "changes of orders" in line)


def _effect(cli: Run, path: Path) -> str:
    return next(line for line in _plan(cli, path) if line.startswith("totals [iceberg"))


def test_plan_shows_the_upstream_changes_the_next_run_would_consume(
    cli: Run, env: str, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    path = tmp_path / "defs.py"
    path.write_text(DEFS)
    spec = importlib.util.spec_from_file_location("changes_defs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    job = module.defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey("orders")]
    ).success

    assert "pending: insert 2, delete 0" in _pending(cli, path)
    assert "full refresh: first run" in _pending(cli, path)
    assert job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey("totals")]
    ).success
    assert "no pending change" in _pending(cli, path)

    module.ROWS["now"] = pl.DataFrame({"id": [2, 3], "grp": ["b", "c"], "amount": [5, 1]})
    assert job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey("orders")]
    ).success
    line = _pending(cli, path)
    assert "pending: insert 1, delete 0, update_before 1, update_after 1" in line
    assert "full refresh" not in line
    # the write it plans is scoped to the changed keys, not the strategy's whole-table sync
    effect = _effect(cli, path)
    assert "sync scoped to the grp values the compute returns" in effect, effect
    assert "delete target rows whose key is absent" not in effect, effect
