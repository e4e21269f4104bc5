"""`pipeline-output flip|status|parity|drain`: the per-dataset migration off the legacy arm."""

from __future__ import annotations

import getpass

import click

from pipeline_output.commands.loading import code_location_options, dataset_specs, spec_named


@click.command()
@code_location_options
@click.argument("dataset")
@click.argument("mode")
@click.option("--reason", default=None, help="Why (kept in the flip history).")
@click.option("--who", default=None, help="Who flips (default: the OS user).")
def flip(dataset: str, mode: str, reason: str | None, who: str | None) -> None:
    """Persist DATASET's mode: pg, iceberg or dual (history: who, when, from, to)."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.canary import flip as do_flip
    from pipeline_output.services.canary import validate_flip

    spec_named(dataset)  # unknown: names the code location
    specs = dataset_specs()
    validate_flip(specs, dataset, mode)  # before anything connects or starts
    publisher = location_runtime().publisher
    before = publisher.resolve(specs[dataset])
    record = do_flip(
        publisher,
        specs,
        dataset,
        mode,
        who=who or getpass.getuser(),
        reason=reason,
    )
    click.echo(
        f"{dataset}: {record.from_mode or f'{before.mode} ({before.source})'} -> {record.to_mode} "
        f"by {record.who} at {record.at:%Y-%m-%d %H:%M:%S}"
    )


@click.command()
@code_location_options
def status() -> None:
    """Every dataset: mode and its source, last deploy per arm, rows per arm, Iceberg files,
    last maintenance, last parity; then the tables no dataset owns (`tables drop`)."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.commands.tables_cmd import orphan_lines
    from pipeline_output.services.canary import status as board

    runtime = location_runtime()
    rows = board(runtime.publisher, dataset_specs())
    header = (
        "dataset",
        "mode",
        "from",
        "last pg deploy",
        "last iceberg deploy",
        "pg rows",
        "iceberg rows",
        "iceberg files (data/delete)",
        "last maintenance",
        "parity",
    )
    body = [
        (
            r.dataset,
            r.mode,
            r.mode_source,
            r.last_pg_deploy,
            r.last_iceberg_deploy,
            "-" if r.pg_rows is None else str(r.pg_rows),
            "-" if r.iceberg_rows is None else str(r.iceberg_rows),
            r.iceberg_files,
            r.last_maintenance,
            r.last_parity,
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=False)]
    for row in [header, *body]:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())
    orphans = orphan_lines(runtime, prefix="")
    if orphans:
        click.echo("")
        for line in orphans:
            click.echo(line)


@click.command()
@code_location_options
@click.argument("dataset")
def parity(dataset: str) -> None:
    """Compare DATASET's two arms now (exit code 1 on a mismatch) and record the result."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.canary import check_parity

    report = check_parity(location_runtime().publisher, spec_named(dataset))
    click.echo(report.summary())
    if not report.passed:
        if report.unwritten:  # one line says it all: nothing to list key by key
            raise SystemExit(1)
        if report.only_in_pg:
            click.echo(f"  only in pg: {report.only_in_pg}")
        if report.only_in_iceberg:
            click.echo(f"  only in iceberg: {report.only_in_iceberg}")
        raise SystemExit(1)


@click.command()
@code_location_options
@click.argument("dataset")
def drain(dataset: str) -> None:
    """Delete DATASET's legacy rows (only when flipped to iceberg and parity last passed)."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.canary import drain as do_drain

    removed = do_drain(location_runtime().publisher, spec_named(dataset))
    click.echo(f"{dataset}: drained {removed} legacy row(s); native re-deploys are unaffected")
