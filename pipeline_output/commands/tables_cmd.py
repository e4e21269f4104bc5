"""`pipeline-output tables drop NAME`: drop a table that no dataset of the code location owns.

Renaming or removing a dataset leaves its Iceberg table behind; `status` lists such tables and
`doctor` warns about them (`services/orphan_tables.py` says which tables count). Dropping one is
never automatic: this command asks first (or takes `--yes`). What *owns* a table is the code
location the command serves (`-m`/`-f`/`-w`, as every command chooses it): its datasets and model
nodes, and the Iceberg sources it reads in the namespace. A `-w` workspace covers all its
locations, so several locations sharing one namespace are served together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pipeline_output.commands.loading import code_location_options

if TYPE_CHECKING:
    from pipeline_output.services.runtime import Runtime


def table_owners(namespace: str) -> dict[str, str]:
    """Table name -> what of the chosen code location owns it: its datasets (and model nodes),
    and its Iceberg sources in `namespace`."""
    from pipeline_output.commands.loading import dataset_specs, source_specs

    owners = {name: f"dataset {name!r}" for name in dataset_specs()}
    for source in source_specs().values():
        where, _, table = str(source.identifier or "").rpartition(".")
        if source.kind == "iceberg" and where == namespace:
            owners.setdefault(table, f"source {source.name!r} (it reads the table)")
    return owners


def orphan_lines(runtime: Runtime, *, prefix: str) -> list[str]:
    """One line per orphan table of the chosen code location's namespace, starting `prefix`."""
    from pipeline_output.services.orphan_tables import orphan_tables

    return [
        f"{prefix}orphan table {orphan.describe()}; drop it: "
        f"pipeline-output tables drop {orphan.name}"
        for orphan in orphan_tables(runtime.iceberg, owners=table_owners(runtime.namespace))
    ]


@click.group()
def tables() -> None:
    """Tables of the namespace no dataset owns (a dataset renamed or removed left them)."""


@tables.command()
@code_location_options
@click.argument("name")
@click.option("--yes", is_flag=True, help="Drop without asking for confirmation.")
def drop(name: str, yes: bool) -> None:
    """Drop table NAME with its files and forget its dataset's control-plane records.

    Only a table pipeline-output wrote that no dataset, model node or Iceberg source of the code
    location owns (as `status` lists them); asks for confirmation unless --yes."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.orphan_tables import drop_table, orphan_named

    runtime = location_runtime()
    orphan = orphan_named(runtime.iceberg, name, owners=table_owners(runtime.namespace))
    if not yes:
        click.confirm(
            f"Drop {orphan.describe()}, deleting its files, and forget every control-plane "
            f"record of dataset {orphan.name!r} (deploys, flips, windows, parity, audits, legacy "
            "rows)?",
            abort=True,
        )
    click.echo(drop_table(runtime.iceberg, runtime.ledger, orphan).describe())
