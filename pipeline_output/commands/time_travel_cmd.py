"""`pipeline-output history DATASET` and `pipeline-output rollback DATASET`: a dataset's native
table through time (`time_travel.py`)."""

from __future__ import annotations

import click

from pipeline_output.commands.loading import code_location_options, spec_named
from pipeline_output.commands.table_output import echo_table
from pipeline_output.errors import InvalidArgument


@click.command()
@click.argument("dataset")
@click.option("--limit", type=int, default=None, help="Only the newest N snapshots.")
@code_location_options
def history(dataset: str, limit: int | None) -> None:
    """Main's snapshots of DATASET, newest first: time, run, strategy, write mode, window, rows
    inserted (+), updated (~), deleted (-)."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.time_travel import history as snapshots

    spec = spec_named(dataset)
    rows = snapshots(location_runtime().iceberg, spec)[:limit]

    def n(value: int | None) -> str:
        return "" if value is None else str(value)

    body = [
        (
            f"{r.snapshot_id}{' *' if r.current else ''}",
            f"{r.committed_at:%Y-%m-%d %H:%M:%S}",
            (r.run_id or "")[:36],
            r.strategy or "",
            r.write_mode or r.operation,
            r.window or "",
            n(r.inserted),
            n(r.updated),
            n(r.deleted),
            n(r.total),
        )
        for r in rows
    ]
    header = ("snapshot", "time (UTC)", "run", "strategy", "write mode", "window", "+", "~", "-")
    echo_table((*header, "rows"), body)
    click.echo("* = main now")


@click.command()
@click.argument("dataset")
@click.option("--to", "to_snapshot", type=int, default=None, help="The snapshot id to go back to.")
@click.option("--before-run", default=None, help="Go back to the snapshot before RUN_ID's writes.")
@click.option(
    "--to-time", default=None, help="The snapshot main was at at this ISO time (with a zone)."
)
@click.option("--reason", default=None, help="Why (kept in the ledger).")
@click.option("--who", default=None, help="Who rolls back (default: the OS user).")
@code_location_options
def rollback(
    dataset: str,
    to_snapshot: int | None,
    before_run: str | None,
    to_time: str | None,
    reason: str | None,
    who: str | None,
) -> None:
    """Point DATASET's main back at an earlier snapshot (one commit, recorded in the ledger);
    windows applied after it go back to planned and are re-applied by the sensor."""
    from datetime import datetime

    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.time_travel import parse_as_of
    from pipeline_output.services.time_travel import rollback as do_rollback

    if sum(x is not None for x in (to_snapshot, before_run, to_time)) != 1:
        raise InvalidArgument("rollback needs exactly one of --to, --before-run, --to-time")
    moment = (
        parse_as_of(to_time, dataset=dataset, what="--to-time") if to_time is not None else None
    )
    if moment is not None and not isinstance(moment, datetime):
        raise InvalidArgument(
            f"dataset {dataset!r}: --to-time {to_time!r} is not a time; use --to for a snapshot id"
        )
    spec = spec_named(dataset)
    runtime = location_runtime()
    record = do_rollback(
        runtime.publisher,
        spec,
        to_snapshot=to_snapshot,
        before_run=before_run,
        to_time=moment,
        reason=reason,
        who=who,
        windows=runtime.windows if spec.delta is not None else None,
    )
    click.echo(
        f"{dataset}: main {record.from_snapshot_id} -> {record.to_snapshot_id} by {record.who} "
        f"at {record.at:%Y-%m-%d %H:%M:%S}; {record.windows_reset} window(s) back to planned"
    )
