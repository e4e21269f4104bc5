"""Tables no dataset owns: renaming or removing a dataset leaves its Iceberg table (and its
control-plane records) behind. They are listed (`pipeline-output status`, `doctor`) and dropped
only on request (`pipeline-output tables drop NAME`), never automatically. Pure core (no Dagster).

A table of the namespace is an *orphan* when pipeline-output wrote it (a snapshot of it carries
`pipeline-output.dataset` naming the table: a table another tool keeps in the namespace is not
ours to list) and nothing of the code location(s) the command serves owns it: no dataset or model
node of that name, no Iceberg source reading it. Nothing else the project keeps is a table of the
namespace: audit branches live inside their dataset's table, staging and legacy rows in Postgres.

Dropping one purges the table (its files with it, whatever the catalog's purge leaves too) and
forgets the dataset's records in the control plane (`Ledger.forget`), in one control-plane
transaction committed once the table is gone, under the table's writer lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow.fs as pafs
from pyiceberg.exceptions import NoSuchNamespaceError
from pyiceberg.table import Table

from pipeline_output.errors import TableDropRefused
from pipeline_output.infra.locks import iceberg_table
from pipeline_output.ledger import Ledger
from pipeline_output.stores.iceberg import IcebergStore
from pipeline_output.stores.iceberg.maintenance.orphans import filesystem
from pipeline_output.stores.iceberg.table.tables import PROPERTY_PREFIX, total_records

DATASET_PROPERTY = f"{PROPERTY_PREFIX}dataset"


@dataclass(frozen=True)
class OrphanTable:
    """A table of the namespace that pipeline-output wrote and no dataset owns."""

    table: str  # namespace.name
    name: str
    rows: int
    last_written: datetime | None  # main's current snapshot

    def describe(self) -> str:
        """`datasets.x (no dataset of this code location; 3 rows, last written ...)`."""
        when = f"{self.last_written:%Y-%m-%d %H:%M:%S} UTC" if self.last_written else "never"
        return (
            f"{self.table} (no dataset of this code location; {self.rows} rows, last written "
            f"{when})"
        )


@dataclass(frozen=True)
class DroppedTable:
    """What `drop_table` removed."""

    table: str
    files: int | None  # files under the table's own directory, all deleted (None: not swept)
    bytes: int
    forgotten: dict[str, int] = field(default_factory=dict)  # control-plane rows, per table

    def describe(self) -> str:
        records = ", ".join(f"{n} {t}" for t, n in self.forgotten.items() if n) or "none"
        files = (
            f"{self.files} file(s), {self.bytes} bytes deleted"
            if self.files is not None
            else "its files purged by the catalog"
        )
        return (
            f"dropped {self.table}: {files}; "
            f"control-plane records of {self.table.rsplit('.', 1)[-1]!r} forgotten: {records}"
        )


def orphan_tables(store: IcebergStore, *, owners: Mapping[str, str]) -> list[OrphanTable]:
    """Every orphan table of the store's namespace, by name. `owners`: table name -> what of the
    code location owns it (its datasets and model nodes, the Iceberg sources in the namespace)."""
    try:
        identifiers = store.catalog.list_tables(store.namespace)
    except NoSuchNamespaceError:
        return []
    out = []
    for identifier in sorted(identifiers):
        name = identifier[-1]
        if name in owners:
            continue
        table = store.tables.load(name)
        if table is not None and written_by_us(table, name):
            out.append(_orphan(store, table, name))
    return out


def written_by_us(table: Table, name: str) -> bool:
    """Whether a snapshot of `table` was committed by pipeline-output for dataset `name`."""
    return any(
        s.summary is not None and s.summary.get(DATASET_PROPERTY) == name
        for s in table.metadata.snapshots
    )


def _orphan(store: IcebergStore, table: Table, name: str) -> OrphanTable:
    snapshot = table.current_snapshot()
    return OrphanTable(
        table=store.table_name(name),
        name=name,
        rows=total_records(table),
        last_written=(
            datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC) if snapshot else None
        ),
    )


def orphan_named(store: IcebergStore, name: str, *, owners: Mapping[str, str]) -> OrphanTable:
    """The orphan table `name` (or `namespace.name`), else `TableDropRefused` saying why not."""
    namespace, _, bare = name.rpartition(".")
    where = f"{store.namespace}.{bare}"
    if namespace and namespace != store.namespace:
        raise TableDropRefused(
            f"table {name}: not in the code location's namespace {store.namespace!r}; "
            "nothing was dropped"
        )
    if bare in owners:
        raise TableDropRefused(
            f"table {where} belongs to {owners[bare]} of the code location; remove it from the "
            "code location first (nothing was dropped)"
        )
    table = store.tables.load(bare)
    if table is None:
        known = [o.name for o in orphan_tables(store, owners=owners)]
        raise TableDropRefused(
            f"no table {where} in the catalog; orphan tables: {', '.join(known) or '(none)'}"
        )
    if not written_by_us(table, bare):
        raise TableDropRefused(
            f"table {where} was not written by pipeline-output (no snapshot names dataset "
            f"{bare!r}); drop it with the tool that owns it (nothing was dropped)"
        )
    return _orphan(store, table, bare)


def drop_table(store: IcebergStore, ledger: Ledger, orphan: OrphanTable) -> DroppedTable:
    """Purge the orphan table and delete every file under its location, and forget its dataset's
    control-plane records (committed once the table is gone; nothing forgotten if the drop
    fails)."""
    lock = store.tables.advisory()
    with lock.hold(iceberg_table(orphan.table)) if lock is not None else nullcontext():
        table = store.tables.load(orphan.name)
        if table is None:
            raise TableDropRefused(f"table {orphan.table} was dropped meanwhile")
        location = table.location().rstrip("/")
        fs, base = filesystem(location, dict(table.io.properties))
        # the table's own directory (`<warehouse>/<namespace>.db/<name>` and the like) is swept
        # after the purge; a location shared with anything else is left to the catalog's purge
        own = location.rsplit("/", 1)[-1].startswith(orphan.name)
        files = _files(fs, base) if own else []
        with ledger.connect() as conn:
            forgotten = ledger.forget(orphan.name, conn=conn)
            store.catalog.purge_table(store.identifier(orphan.name))
            conn.commit()
        if own:  # what the purge left: files of expired snapshots and of failed writes
            with suppress(FileNotFoundError):
                fs.delete_dir(base)
    return DroppedTable(
        table=orphan.table,
        files=len(files) if own else None,
        bytes=sum(info.size or 0 for info in files),
        forgotten=forgotten,
    )


def _files(fs: pafs.FileSystem, base: str) -> list[pafs.FileInfo]:
    found = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return [info for info in found if info.type == pafs.FileType.File]
