"""`pipeline-output maintain [DATASET...] [--audits [AGE]] [--compact] [--expire [AGE]] [--orphans]
[--dry-run]`: table maintenance of the code location's datasets, with a progress bar (stderr) and a
before/after table (stdout)."""

from __future__ import annotations

import re
import sys
from datetime import timedelta
from typing import Any

import click

from pipeline_output.commands.loading import code_location_options, dataset_specs, spec_named
from pipeline_output.commands.table_output import echo_table
from pipeline_output.errors import InvalidArgument
from pipeline_output.services.maintenance import MaintenanceOptions, TableMaintenance

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
DEFAULT_EXPIRE = "5d"
DEFAULT_AUDITS = "7d"


def parse_age(text: str, *, option: str = "--expire") -> timedelta:
    """`90s`, `30m`, `12h`, `5d`, `2w` (a bare number is seconds) as a timedelta."""
    found = _AGE.match(text)
    if found is None:
        raise InvalidArgument(f"{option} {text!r}: an age like 90s, 30m, 12h, 5d or 2w")
    return timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2)])


@click.command()
@code_location_options
@click.argument("datasets", nargs=-1)
@click.option(
    "--audits",
    "audits",
    is_flag=False,
    flag_value=DEFAULT_AUDITS,
    default=None,
    metavar="[AGE]",
    help=f"Drop branches of audits undecided or failed for longer than AGE (default "
    f"{DEFAULT_AUDITS}).",
)
@click.option("--compact", "do_compact", is_flag=True, help="Bin-pack small files.")
@click.option(
    "--expire",
    "expire",
    is_flag=False,
    flag_value=DEFAULT_EXPIRE,
    default=None,
    metavar="[AGE]",
    help=f"Expire snapshots older than AGE (default {DEFAULT_EXPIRE}) and delete their files.",
)
@click.option("--orphans", "do_orphans", is_flag=True, help="Remove unreferenced files.")
@click.option("--dry-run", is_flag=True, help="Plan and count; change nothing.")
@click.option(
    "--force",
    is_flag=True,
    help="Expire even snapshots an incremental downstream has not consumed yet (its next run "
    "is then a full refresh).",
)
@click.option("--retain-last", default=1, show_default=True, help="Snapshots always kept.")
@click.option(
    "--grace",
    "grace_s",
    type=float,
    default=3600.0,
    show_default=True,
    help="Orphans: only files older than this many seconds.",
)
@click.option("--target-file-size", type=int, default=None, help="Compaction target, bytes.")
@click.option("--min-input-files", type=int, default=5, show_default=True)
def maintain(
    datasets: tuple[str, ...],
    audits: str | None,
    do_compact: bool,
    expire: str | None,
    do_orphans: bool,
    **settings: Any,
) -> None:
    """Drop stale audit branches, compact, expire snapshots and remove orphan files (all four
    unless some are chosen)."""
    # `settings`: the options named as `MaintenanceOptions`' fields (--dry-run, --force,
    # --retain-last, --grace, --target-file-size, --min-input-files), passed as they are
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.maintenance import maintain as run

    specs = dataset_specs()
    for name in datasets:
        spec_named(name)  # an unknown one fails naming the code location and the known ones
    everything = not (audits is not None or do_compact or expire is not None or do_orphans)
    options = MaintenanceOptions(
        audits=audits is not None or everything,
        audit_retention=parse_age(audits or DEFAULT_AUDITS, option="--audits"),
        compact=do_compact or everything,
        expire=expire is not None or everything,
        orphans=do_orphans or everything,
        older_than=parse_age(expire or DEFAULT_EXPIRE),
        **settings,
    )
    chosen = [specs[name] for name in (datasets or sorted(specs))]
    steps = len(chosen) * sum((options.audits, options.compact, options.expire, options.orphans))
    runtime = location_runtime()
    with click.progressbar(
        length=steps,
        label="maintenance" + (" (dry run)" if options.dry_run else ""),
        file=sys.stderr,
        show_pos=True,
        item_show_func=lambda item: item,
    ) as bar:
        current = [""]

        def step(dataset: str, what: str) -> None:
            current[0] = dataset
            bar.update(1, f"{dataset}: {what}")

        def bins(done: int, planned: int) -> None:  # a long compaction moves the bar's text
            bar.update(0, f"{current[0]}: compact, bin {done}/{planned}")

        reports = run(
            runtime.iceberg,
            chosen,
            options=options,
            ledger=runtime.windows,
            on_step=step,
            on_bins=bins,
            publisher=runtime.publisher,
        )
    _table(reports, dry_run=options.dry_run)
    for report in reports:
        for line in report.lines():
            click.echo(line)
    failed = [r.dataset for r in reports if r.errors]
    if failed:
        click.echo(f"maintenance failed for {', '.join(failed)}", err=True)
        raise SystemExit(1)


def _table(reports: list[TableMaintenance], *, dry_run: bool) -> None:
    """Before -> after per dataset: data files, delete files, snapshots, metadata bytes."""
    header = ("dataset", "data files", "delete files", "snapshots", "metadata bytes")
    body: list[tuple[str, ...]] = []
    for r in reports:
        if r.before is None:
            body.append((r.dataset, "-", "-", "-", "-"))
            continue
        after = r.after if r.after is not None and not dry_run else None
        cells = [r.dataset]
        for name in ("data_files", "delete_files", "snapshots", "metadata_bytes"):
            old = getattr(r.before, name)
            new = getattr(after, name) if after is not None else "(dry run)"
            cells.append(f"{old} -> {new}")
        body.append(tuple(cells))
    echo_table(header, body)
