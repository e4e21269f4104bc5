"""`pipeline-output materialize`: run assets headless against the project's Dagster instance."""

from __future__ import annotations

import importlib

import click

from pipeline_output import dagster_home
from pipeline_output.errors import PipelineOutputError
from pipeline_output.settings import get_settings

DEFINITIONS = "pipeline_output.definitions:defs"


@click.command()
@click.option("--select", "select", default=None, help="Dagster asset selection (default: all).")
def materialize(select: str | None) -> None:
    """Materialise assets in this process, recording the run in the project's instance."""
    settings = get_settings()
    dagster_home.activate(settings)

    import dagster as dg

    module_name, _, attr = DEFINITIONS.partition(":")
    defs: dg.Definitions = getattr(importlib.import_module(module_name), attr)
    job = defs.resolve_implicit_global_asset_job_def()
    keys = None
    if select:
        try:
            keys = dg.AssetSelection.from_string(select).resolve(defs.resolve_asset_graph())
        except Exception as exc:  # dagster raises several types for a bad selection
            raise PipelineOutputError(f"--select {select!r}: {exc}") from exc
        if not keys:
            raise PipelineOutputError(f"--select {select!r} matches no asset")

    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(
            instance=instance,
            asset_selection=sorted(keys) if keys is not None else None,
            raise_on_error=False,
        )
    run_id = result.run_id
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        meta = ", ".join(
            f"{k}={getattr(v, 'value', v)}" for k, v in sorted(materialization.metadata.items())
        )
        click.echo(
            f"materialized {materialization.asset_key.to_user_string()}: {meta} (run {run_id})"
        )
    if not result.success:
        failed = [e.step_key for e in result.all_events if e.is_step_failure]
        raise PipelineOutputError(f"run {run_id} failed at step(s): {', '.join(map(str, failed))}")
