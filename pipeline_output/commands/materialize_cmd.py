"""`pipeline-output materialize`: run the project's assets headless against its Dagster instance.

Plans pending delta windows (each window sensor evaluated once), applies them per dataset in a
single-run backfill, runs the other assets, and prints one line per asset and arm: dataset, arm,
mode, write mode, rows in/inserted/updated/deleted, snapshot, result, note. A failure stops only
what depends on it: every asset still gets its line, each failure one `error:` line on stderr
(no traceback), and the exit code is 1. Dagster's own log stays off the console unless
`--verbose`; the full log of the runs (tracebacks included) goes to a file whose path is printed.
With the demo definitions and an unseeded database it seeds the demo shop first (say so), so a
fresh clone works in one command.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import click

from pipeline_output.commands.loading import (
    check_environment_catalog,
    code_location_options,
    dataset_selection,
    load_definitions,
    runs_demo,
)
from pipeline_output.errors import PipelineOutputError
from pipeline_output.infra import dagster_home
from pipeline_output.infra.settings import get_settings

FAILED_EXIT_CODE = 1


@contextlib.contextmanager
def python_logs(log_file: Path, *, verbose: bool) -> Iterator[None]:
    """Python `logging` of Dagster and the libraries (warnings Dagster logs itself, not through
    the run's console logger) goes to `log_file`, not the console — unless `verbose`."""
    if verbose:
        yield
        return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-8s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)  # with a handler, nothing reaches logging's stderr fallback
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def log_path(home: Path, command: str) -> Path:
    """Where a command's full run log goes: `$PIPELINE_OUTPUT_HOME/logs/<command>-<time>.log`."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return home / "logs" / f"{command}-{stamp}.log"


@click.command()
@click.argument("datasets", nargs=-1, metavar="[DATASET]...")
@click.option(
    "--select",
    "select",
    multiple=True,
    help="Dagster asset selection (repeatable), besides the DATASETs named.",
)
@click.option(
    "--partition",
    "partition",
    default=None,
    metavar="KEY",
    help="Run the selected Dagster-partitioned assets for this partition key.",
)
@click.option(
    "--partition-range",
    "partition_range",
    default=None,
    metavar="FIRST...LAST",
    help="Run them over this range of keys in one run each (a single-run backfill).",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Show Dagster's log (DEBUG) and tracebacks on the console.",
)
@code_location_options
def materialize(
    datasets: tuple[str, ...],
    select: tuple[str, ...],
    partition: str | None,
    partition_range: str | None,
    verbose: bool,
) -> None:
    """Materialise assets in this process, recording the runs in the project's instance:
    the DATASETs named and the --select ones (default: every asset)."""
    partitions = _partitions(partition, partition_range)
    settings = get_settings()
    check_environment_catalog(settings)
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
    select = (*select, *(dataset_selection(name) for name in datasets))
    graph = defs.resolve_asset_graph()
    for text in select:
        try:
            keys = dg.AssetSelection.from_string(text).resolve(graph)
        except Exception as exc:  # dagster raises several types for a bad selection
            raise PipelineOutputError(f"--select {text!r}: {exc}") from exc
        if not keys:
            raise PipelineOutputError(f"--select {text!r} matches no asset")
    log_file = log_path(settings.home, "materialize")
    with python_logs(log_file, verbose=verbose), dg.DagsterInstance.get() as instance:
        report = run_all(
            defs,
            instance,
            selection=list(select) or None,
            partitions=partitions,
            log_level="DEBUG" if verbose else "CRITICAL",
            log_file=log_file,
        )
    if report.rows:
        click.echo(format_table(report.rows))
    if report.run_ids:
        click.echo(f"runs: {', '.join(sorted(set(report.run_ids)))}")
    finish(report, log_file)


def _partitions(partition: str | None, partition_range: str | None) -> tuple[str, str] | None:
    """(first, last) of `--partition KEY` or `--partition-range FIRST...LAST` (dg's syntax)."""
    if partition is not None and partition_range is not None:
        raise click.UsageError("give --partition or --partition-range, not both")
    if partition is not None:
        return partition, partition
    if partition_range is None:
        return None
    first, sep, last = partition_range.partition("...")
    if not sep or not first or not last:
        raise click.UsageError(f"--partition-range {partition_range!r}: expected FIRST...LAST")
    return first, last


def finish(report: object, log_file: Path) -> None:
    """Warnings and one `error:` line per failure on stderr, the log's path; exit 1 on failure."""
    from pipeline_output.dagster_layer.run_report import RunOutcome

    assert isinstance(report, RunOutcome)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    for failure in report.failures:
        prefix = "error (retryable)" if failure.retryable else "error"
        click.echo(f"{prefix}: {failure.message}", err=True)
    if log_file.exists():
        click.echo(f"full log: {log_file}", err=True)
    if not report.ok:
        raise SystemExit(FAILED_EXIT_CODE)


def _seed_demo_if_needed(url: str) -> None:
    from pipeline_output.demo import shop_data

    if shop_data.current_tick(url) is None:
        counts = shop_data.seed(url)
        click.echo(
            "demo shop not seeded yet: seeded it (pipeline-output demo seed): "
            + ", ".join(f"{k}={v}" for k, v in counts.items())
        )
