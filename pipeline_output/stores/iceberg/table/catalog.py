"""`FlatSqlCatalog`: pyiceberg's SQL catalog without the per-commit work that grows with a table's
history.

pyiceberg's `SqlCatalog` parses the table's whole `metadata.json` on every `load_table` (a write
loads the table twice, and the commit loads it once more) and deep-copies the whole metadata when
it stages a commit. `metadata.json` holds every snapshot, so after 1,000 writes those four passes
took ~0.27 s of every write. Metadata files are written once and never changed, so the parsed
metadata is kept by file location (a small LRU per catalog handle): a load still asks the catalog
database for the current location — another process's commit is seen at once — and parses only a
location it has not seen. A commit stages its metadata without the deep copy
(`manifests.staged_metadata`) and caches what it wrote. It honours Iceberg's
`write.metadata.compression-codec=gzip` (pyiceberg's catalog does not): the new metadata file is
`<version>-<uuid>.gz.metadata.json`, gzip'd, which every Iceberg reader opens by its name; each
file then takes about a tenth of the space of the table's history it lists.

It is the project's default catalog (settings: the embedded/control-plane Postgres, or a `type:
sql` pyiceberg configuration); any other pyiceberg catalog works unchanged.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import Identifier

from pipeline_output.errors import SettingsError
from pipeline_output.infra.pg_urls import one_line
from pipeline_output.stores.iceberg.snapshot.manifests import staged_metadata

_CACHED_VERSIONS = 64
METADATA_CODEC = "write.metadata.compression-codec"  # Iceberg's table property: none | gzip


class FlatSqlCatalog(SqlCatalog):
    """A `SqlCatalog` that parses each metadata file once and stages commits without copies."""

    def __init__(self, name: str, **properties: Any) -> None:
        super().__init__(name, **properties)
        self._po_parsed: OrderedDict[str, TableMetadata] = OrderedDict()
        self._po_guard = threading.Lock()

    def _po_remember(self, location: str, metadata: TableMetadata) -> None:
        with self._po_guard:
            self._po_parsed[location] = metadata
            self._po_parsed.move_to_end(location)
            while len(self._po_parsed) > _CACHED_VERSIONS:
                self._po_parsed.popitem(last=False)

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        location = orm_table.metadata_location
        with self._po_guard:
            metadata = self._po_parsed.get(location) if location else None
        if (
            location is None
            or metadata is None
            or not orm_table.table_namespace
            or not orm_table.table_name
        ):
            table = super()._convert_orm_to_iceberg(orm_table)
            self._po_remember(table.metadata_location, table.metadata)
            return table
        return Table(
            identifier=(
                *Catalog.identifier_to_tuple(orm_table.table_namespace),
                orm_table.table_name,
            ),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )

    def _update_and_stage_table(
        self,
        current_table: Table | None,
        table_identifier: Identifier,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> StagedTable:
        if current_table is None:  # a create: pyiceberg validates the new metadata fully
            return super()._update_and_stage_table(
                current_table, table_identifier, requirements, updates
            )
        for requirement in requirements:
            requirement.validate(current_table.metadata)
        metadata = staged_metadata(
            current_table.metadata, updates, metadata_location=current_table.metadata_location
        )
        version = self._parse_metadata_version(current_table.metadata_location) + 1
        provider = load_location_provider(metadata.location, metadata.properties)
        location = provider.new_table_metadata_file_location(version)
        codec = metadata.properties.get(METADATA_CODEC, "none").lower()
        if codec == "gzip":  # Iceberg's name for a gzip'd metadata file; readers go by it
            location = location.removesuffix(".metadata.json") + ".gz.metadata.json"
        return StagedTable(
            identifier=table_identifier,
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(properties=metadata.properties, location=location),
            catalog=self,
        )

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        response = super().commit_table(table, requirements, updates)
        self._po_remember(response.metadata_location, response.metadata)
        return response


def open_catalog(
    name: str,
    config: Mapping[str, str],
    *,
    namespace: str | None = None,
    where: Callable[[str], str],
) -> Catalog:
    """The pyiceberg catalog `config` describes, with `namespace` created in it when given. A SQL
    catalog is `FlatSqlCatalog`, built directly (`load_catalog` would merge a `PYICEBERG_*` `type`
    back in) and retried (two processes creating its tables race); a Postgres one gets
    `pool_pre_ping` (a connection the server dropped is replaced before use). `where(key)` names
    the setting a bad `key` came from, for the `SettingsError`."""
    catalog = _load(name, config, where=where)
    if namespace is not None:
        ensure_namespace(catalog, namespace)
    return catalog


def _load(name: str, config: Mapping[str, str], *, where: Callable[[str], str]) -> Catalog:
    from pyiceberg.catalog import load_catalog
    from sqlalchemy.exc import DBAPIError

    props = dict(config)
    if props.get("type") == "sql" or str(props.get("uri", "")).startswith("postgresql"):
        props.setdefault("pool_pre_ping", "true")
    try:
        if props.get("type") == "sql" and "py-catalog-impl" not in props:
            props.pop("type")
            for attempt in range(3):
                try:
                    return FlatSqlCatalog(name, **props)
                except DBAPIError:
                    if attempt == 2:
                        raise
        return load_catalog(name, **props)
    except ValueError as exc:
        raise SettingsError(where("type"), one_line(exc)) from exc


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create `namespace` unless it exists; a concurrent creator winning the race is fine."""
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise
