"""`pipeline-output materialize`: run the project's assets headless against its Dagster instance.

Plans pending delta windows (each window sensor evaluated once), applies them per dataset in a
single-run backfill, runs the other assets, and prints one line per asset: dataset, mode, write
mode, rows in/inserted/updated/deleted, snapshot. With the demo definitions and an unseeded
database it seeds the demo shop first (say so), so a fresh clone works in one command.
"""

from __future__ import annotations

import click

from pipeline_output.commands.loading import code_location_options, load_definitions, runs_demo
from pipeline_output.errors import (
    PipelineOutputError,
    RetryableError,
    TerminalError,
    from_third_party,
)
from pipeline_output.infra import dagster_home
from pipeline_output.infra.settings import get_settings


@click.command()
@click.option(
    "--select",
    "select",
    multiple=True,
    help="Dagster asset selection (repeatable; default: every asset).",
)
@code_location_options
def materialize(select: tuple[str, ...]) -> None:
    """Materialise assets in this process, recording the runs in the project's instance."""
    settings = get_settings()
    dagster_home.activate(settings)

    import warnings

    import dagster as dg

    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    from pipeline_output.dagster_layer.runner import format_table
    from pipeline_output.dagster_layer.runner import materialize as run_all

    defs = load_definitions()
    if runs_demo():  # a user's code location is never seeded with the demo shop
        _seed_demo_if_needed(settings.control_plane_url())
    graph = defs.resolve_asset_graph()
    for text in select:
        try:
            keys = dg.AssetSelection.from_string(text).resolve(graph)
        except Exception as exc:  # dagster raises several types for a bad selection
            raise PipelineOutputError(f"--select {text!r}: {exc}") from exc
        if not keys:
            raise PipelineOutputError(f"--select {text!r} matches no asset")
    with dg.DagsterInstance.get() as instance:
        try:
            rows = run_all(defs, instance, selection=list(select) or None, log_level="WARNING")
        except dg.DagsterExecutionStepExecutionError as exc:
            cause = exc.__cause__ or exc
            known = from_third_party(cause) if isinstance(cause, Exception) else None
            if known is not None:  # keep its kind: a retryable failure exits 75
                kind = RetryableError if known.retryable else TerminalError
                raise kind(f"materialize failed: {' '.join(str(known).split())[:500]}") from exc
            raise PipelineOutputError(
                f"materialize failed: {' '.join(str(cause).split())[:500]}"
            ) from exc
    click.echo(format_table(rows))
    runs = sorted({r.run_id for r in rows})
    click.echo(f"runs: {', '.join(runs)}")


def _seed_demo_if_needed(url: str) -> None:
    from pipeline_output.demo import shop_data

    if shop_data.current_tick(url) is None:
        counts = shop_data.seed(url)
        click.echo(
            "demo shop not seeded yet: seeded it (pipeline-output demo seed): "
            + ", ".join(f"{k}={v}" for k, v in counts.items())
        )
