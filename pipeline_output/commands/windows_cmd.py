"""`pipeline-output windows DATASET` and `windows restate DATASET WINDOW`: the watermark ledger."""

from __future__ import annotations

import click

from pipeline_output.commands.loading import code_location_options, dataset_specs, spec_named
from pipeline_output.errors import PipelineOutputError


class _WindowsGroup(click.Group):
    """`windows DATASET` lists; `windows restate ...` restates."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # `windows [options] DATASET` is `windows list [options] DATASET`
        if args and not any(a in self.commands for a in args) and args[0] not in ("--help", "-h"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_WindowsGroup)
def windows() -> None:
    """Delta windows of a dataset (`pipeline-output windows DATASET`)."""


def _spec(dataset: str):  # type: ignore[no-untyped-def]
    spec = spec_named(dataset)
    if spec.delta is None:
        specs = dataset_specs()
        deltas = sorted(n for n, s in specs.items() if s.delta is not None)
        raise PipelineOutputError(
            f"{dataset!r} is not a delta dataset; delta datasets: {', '.join(deltas) or '(none)'}"
        )
    return spec


@windows.command("list")
@click.argument("dataset")
@code_location_options
def list_windows(dataset: str) -> None:
    """The ledger as a table: state, rows, snapshot, run; gaps and failed windows flagged."""
    from pipeline_output.commands.loading import location_runtime

    _spec(dataset)
    rows = location_runtime().windows.windows(dataset)
    if not rows:
        click.echo(f"{dataset}: no windows planned yet (the sensor or `materialize` plans them)")
        return
    header = f"{'seq':>4}  {'window':<28} {'state':<9} {'attempts':>8} {'rows':>8}  snapshot / deploy     run"
    click.echo(header)
    prev_high = None
    for w in rows:
        flag = ""
        if prev_high is not None and w.window.low != prev_high:
            flag = "  <-- GAP"
        if w.state == "failed":
            flag += f"  <-- FAILED: {w.error or ''}"[:120]
        target = w.iceberg_snapshot_id or w.pg_deploy_id or ""
        click.echo(
            f"{w.seq:>4}  {w.window!s:<28} {w.state:<9} {w.attempts:>8} "
            f"{w.rows_written if w.rows_written is not None else '':>8}  {target!s:<21} "
            f"{(w.run_id or '')[:8]}{flag}"
        )
        prev_high = w.window.high


@windows.command()
@click.argument("dataset")
@click.argument("window")
@code_location_options
def restate(dataset: str, window: str) -> None:
    """Replace exactly WINDOW's rows (partition key `low..high`) in one commit."""
    import dagster as dg

    from pipeline_output.commands.loading import load_definitions, location_runtime
    from pipeline_output.infra import dagster_home
    from pipeline_output.infra.settings import get_settings

    _spec(dataset)
    if location_runtime().windows.get(dataset, window) is None:
        raise PipelineOutputError(f"{dataset}: no window {window!r} in the ledger")
    dagster_home.activate(get_settings())
    defs = load_definitions()
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(
            instance=instance,
            asset_selection=[dg.AssetKey(dataset)],
            partition_key=window,
            run_config={"ops": {dataset: {"config": {"restate": True}}}},
            raise_on_error=False,
        )
    if not result.success:
        raise PipelineOutputError(f"{dataset}: restating {window} failed (run {result.run_id})")
    click.echo(f"{dataset}: window {window} restated (run {result.run_id})")
