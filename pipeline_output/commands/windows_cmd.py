"""`pipeline-output windows DATASET` and `windows restate DATASET WINDOW`: the watermark ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipeline_output.commands.loading import code_location_options, dataset_specs, spec_named
from pipeline_output.errors import PipelineOutputError

if TYPE_CHECKING:
    from pipeline_output.contract.windows import WindowRow


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


DEFAULT_LIMIT = 20  # a screenful


@windows.command("list")
@click.argument("dataset")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=0),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Show the newest N windows (newest last); 0 shows every window.",
)
@code_location_options
def list_windows(dataset: str, limit: int) -> None:
    """The ledger as a table: state, rows, snapshot, run; gaps and failed windows flagged."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.commands.table_output import echo_table

    _spec(dataset)
    ledger = location_runtime().windows
    rows = ledger.recent(dataset, limit=limit) if limit else ledger.windows(dataset)
    if not rows:
        click.echo(f"{dataset}: no windows planned yet (the sensor or `materialize` plans them)")
        return
    header = ("seq", "window", "state", "attempts", "rows", "snapshot / deploy", "run", "")
    table = []
    prev_high = None
    for w in rows:
        flag = "<-- GAP" if prev_high is not None and w.window.low != prev_high else ""
        if w.state == "failed":
            flag = f"{flag}  <-- FAILED: {w.error or ''}".strip()[:120]
        target = w.iceberg_snapshot_id or w.pg_deploy_id or ""
        written = "" if w.rows_written is None else w.rows_written
        run = (w.run_id or "")[:8]
        cells = (w.seq, w.window, w.state, w.attempts, written, target, run, flag)
        table.append(tuple(str(c) for c in cells))
        prev_high = w.window.high
    echo_table(header, table)
    counts = ledger.state_counts(dataset)
    total = sum(counts.values())
    if len(rows) < total:
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        click.echo(
            f"showing the newest {len(rows)} of {total} windows ({states}); "
            "--limit N for more, --limit 0 for all"
        )


def window_row(dataset: str, window: str) -> WindowRow:
    """The ledger row `window` names: its `seq` number (as `windows DATASET` lists it), its
    partition key `low..high`, or the `(low, high]` text the listing shows."""
    from pipeline_output.commands.loading import location_runtime

    rows = location_runtime().windows.windows(dataset)
    text = window.strip()
    for row in rows:
        if text in (str(row.seq), row.partition_key, str(row.window)):
            return row
    span = f"1..{rows[-1].seq}" if rows else "none planned yet"
    raise PipelineOutputError(
        f"{dataset}: no window {window!r} in the ledger; give its seq number as `pipeline-output "
        f"windows {dataset}` lists it ({span}) or its partition key `low..high`"
    )


def _dataset_asset(defs: Any, dataset: str) -> Any:
    """The asset of the dataset named `dataset` in `defs`: its real key (a `key_prefix` is part of
    it) and op name, never `AssetKey(dataset)`."""
    from pipeline_output.dagster_layer.dataset import spec_of

    for asset in defs.assets or []:
        spec = spec_of(asset)
        if spec is not None and spec.name == dataset:
            return asset
    raise PipelineOutputError(f"{dataset}: no asset of that dataset in the code location")


def _known_partition(instance: Any, asset: Any, partition_key: str) -> None:
    """Add the window's partition to `instance` when it lacks it: the ledger is the truth on
    windows, the partitions of another instance (a redeploy with new run storage) may be gone."""
    import dagster as dg

    partitions = asset.partitions_def
    name = partitions.name if isinstance(partitions, dg.DynamicPartitionsDefinition) else None
    if name is not None and not instance.has_dynamic_partition(name, partition_key):
        instance.add_dynamic_partitions(name, [partition_key])


@windows.command()
@click.argument("dataset")
@click.argument("window")
@click.option("--verbose", "-v", is_flag=True, help="Show Dagster's log (DEBUG) and tracebacks.")
@code_location_options
def restate(dataset: str, window: str, verbose: bool) -> None:
    """Replace exactly WINDOW's rows in one commit: WINDOW is the window's seq number as
    `windows DATASET` lists it (or its partition key `low..high`)."""
    import dagster as dg

    from pipeline_output.commands.loading import check_environment_catalog, load_definitions
    from pipeline_output.commands.materialize_cmd import finish, log_path, python_logs
    from pipeline_output.dagster_layer.runner import execute, format_table
    from pipeline_output.infra import dagster_home
    from pipeline_output.infra.settings import get_settings

    _spec(dataset)
    row = window_row(dataset, window)
    settings = get_settings()
    check_environment_catalog(settings)
    dagster_home.activate(settings)
    defs = load_definitions()
    asset = _dataset_asset(defs, dataset)
    log_file = log_path(settings.home, "restate")
    with python_logs(log_file, verbose=verbose), dg.DagsterInstance.get() as instance:
        _known_partition(instance, asset, row.partition_key)
        report = execute(
            defs.resolve_implicit_global_asset_job_def(),
            defs,
            instance,
            asset_keys=[asset.key],  # with its `key_prefix`, if any
            partition_key=row.partition_key,
            ops_config={asset.node_def.name: {"config": {"restate": True}}},
            log_level="DEBUG" if verbose else "CRITICAL",
            log_file=log_file,
        )
    click.echo(format_table(report.rows))
    if report.ok:
        click.echo(
            f"{dataset}: window {row.seq} {row.window} restated (partition {row.partition_key}, "
            f"run {report.run_ids[0]})"
        )
    finish(report, log_file)
