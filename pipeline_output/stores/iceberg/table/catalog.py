"""`FlatSqlCatalog`: pyiceberg's SQL catalog without the per-commit work that grows with a table's
history.

pyiceberg's `SqlCatalog` parses the table's whole `metadata.json` on every `load_table` (a write
loads the table twice, and the commit loads it once more) and deep-copies the whole metadata when
it stages a commit. `metadata.json` holds every snapshot, so after 1,000 writes those four passes
took ~0.27 s of every write. Metadata files are written once and never changed, so the parsed
metadata is kept by file location (a small LRU per catalog handle): a load still asks the catalog
database for the current location — another process's commit is seen at once — and parses only a
location it has not seen (one plain query, not pyiceberg's ORM select, whose compiling costs
~10 ms on a process's first load). A commit stages its metadata without the deep copy
(`manifests.staged_metadata`) and caches what it wrote. It honours Iceberg's
`write.metadata.compression-codec=gzip` (pyiceberg's catalog does not): the new metadata file is
`<version>-<uuid>.gz.metadata.json`, gzip'd, which every Iceberg reader opens by its name; each
file then takes about an eighth of the space of the table's history it lists (gzip's fastest level).

Its round trips to the catalog database are the fewest that keep pyiceberg's behaviour: opening
it is one probe (both tables and the v1 column present, and — when asked — whether the dataset
namespace exists; pyiceberg's checks, which create a missing table, only when the probe fails),
a load is one statement outside a transaction, and a commit of a table as this handle loaded it
updates the row it loaded from (`UPDATE ... WHERE metadata_location = <the loaded one>`, one
statement) without loading the table again — when the row moved since (another writer
committed), or the table is a view of other metadata, pyiceberg's own commit runs:
it reloads, checks the requirements against the current metadata and commits or refuses as
before. A handle remembers the namespaces it has seen exist (`ensure_namespace` asks once).

On a psycopg database (`postgresql+psycopg://`, the default: the control plane's) those plain
statements run on the process's pooled control-plane sessions (`pgsession.pooled`), a write's
swap on the very session holding its lock (`share`): a process's first write opens one
connection for the lock, the ledger and the catalog, and SQLAlchemy's engine connects only for
what pyiceberg does itself (creating, listing and dropping tables and namespaces, a commit whose
row moved) — its first connect is ~5 ms of dialect queries (benchmarks/results/small-writes.md,
"Session 11").

It is the project's default catalog (settings: the embedded/control-plane Postgres, or a `type:
sql` pyiceberg configuration); any other pyiceberg catalog works unchanged.
"""

from __future__ import annotations

import gzip
import importlib
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.errors import UndefinedColumn, UndefinedTable
from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import ICEBERG_TABLE_TYPE, IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.io import PY_IO_IMPL, FileIO, load_file_io
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate, ValidatableTableRequirement
from pyiceberg.typedef import Identifier
from pyiceberg.utils.config import Config
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, ProgrammingError

from pipeline_output.errors import (
    CatalogRefused,
    CatalogUnavailable,
    SettingsError,
    from_third_party,
)
from pipeline_output.infra import pgsession
from pipeline_output.infra.settings import connect_failure, one_line
from pipeline_output.stores.iceberg.snapshot.manifests import staged_metadata
from pipeline_output.stores.iceberg.table.file_io import IMPL as FILE_IO


class _Statement:
    """One of the catalog's plain statements, with `:name` parameters: run by SQLAlchemy
    (`text`) or by a psycopg session (`%(name)s`; the statements hold no other `:` or `%`)."""

    def __init__(self, statement: str) -> None:
        self.text = text(statement)
        self.psycopg = sql.SQL(re.sub(r":(\w+)", r"%(\1)s", statement))


_CACHED_VERSIONS = 64
# pyiceberg's `SqlCatalog.load_table` lookup (`IcebergTables`), without its ORM
_LOAD = _Statement(
    "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = :catalog "
    "AND table_namespace = :namespace AND table_name = :table"
)
_LOAD_V1 = _Statement(
    "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = :catalog "
    "AND table_namespace = :namespace AND table_name = :table "
    "AND (iceberg_type = :kind OR iceberg_type IS NULL)"
)
# the commit of a table loaded from `previous`: pyiceberg's UPDATE, as one plain statement
_MOVE = _Statement(
    "UPDATE iceberg_tables SET metadata_location = :location, previous_metadata_location = "
    ":previous WHERE catalog_name = :catalog AND table_namespace = :namespace AND table_name = "
    ":table AND metadata_location = :previous"
)
# pyiceberg's `_init_catalog` checks in one statement: both tables and the v1 column exist
_PROBE = _Statement(
    "SELECT (SELECT iceberg_type FROM iceberg_tables LIMIT 0), "
    "(SELECT 1 FROM iceberg_namespace_properties LIMIT 0)"
)
# ... and whether a namespace exists (pyiceberg's `namespace_exists`: a table or a property of
# it or of a namespace under it)
_PROBE_NAMESPACE = _Statement(
    "SELECT (SELECT iceberg_type FROM iceberg_tables LIMIT 0), "
    "EXISTS (SELECT 1 FROM iceberg_tables WHERE catalog_name = :catalog AND "
    "(table_namespace = :namespace OR table_namespace LIKE :under ESCAPE '!')) OR "
    "EXISTS (SELECT 1 FROM iceberg_namespace_properties WHERE catalog_name = :catalog AND "
    "(namespace = :namespace OR namespace LIKE :under ESCAPE '!'))"
)
_PSYCOPG = "postgresql+psycopg://"
METADATA_CODEC = "write.metadata.compression-codec"  # Iceberg's table property: none | gzip


class FlatSqlCatalog(SqlCatalog):
    """A `SqlCatalog` that parses each metadata file once and stages commits without copies."""

    def __init__(self, name: str, *, probe_namespace: str | None = None, **properties: Any) -> None:
        """pyiceberg's `SqlCatalog(name, **properties)`; `probe_namespace`: a namespace whose
        existence the opening probe also asks (`ensure_namespace` then needs no query)."""
        self._po_parsed: OrderedDict[str, TableMetadata] = OrderedDict()
        self._po_guard = threading.Lock()
        self._po_namespaces: set[str] = set()
        self._po_probe_namespace = probe_namespace
        uri = str(properties.get("uri", ""))
        # a psycopg database: the plain statements run on this process's pooled sessions
        # (`pgsession.pooled`), the control plane's when it is the same database — no
        # connection of the engine's own, nor SQLAlchemy's first-connect queries, for them
        self._po_session_url = (
            "postgresql://" + uri.removeprefix(_PSYCOPG) if uri.startswith(_PSYCOPG) else None
        )
        super().__init__(name, **properties)

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        """pyiceberg's metadata write, a `.gz.metadata.json` gzip'd at the fastest level:
        pyiceberg compresses at the slowest (9), ~4x the time for files ~15 % smaller,
        and the file — every snapshot of the table's history — is written whole by every commit
        (~2 ms a commit at 100 snapshots). Any gzip reader reads either."""
        if not metadata_path.endswith(".gz.metadata.json"):
            ToOutputFile.table_metadata(metadata, io.new_output(metadata_path))
            return
        # as pyiceberg's `ToOutputFile.table_metadata`: `None` fields left out unless legacy
        exclude_none = not Config().get_bool("legacy-current-snapshot-id")
        raw = metadata.model_dump_json(exclude_none=exclude_none).encode("utf-8")
        with io.new_output(metadata_path).create(overwrite=False) as stream:
            stream.write(gzip.compress(raw, compresslevel=1))

    def _po_run(self, statement: _Statement, params: Mapping[str, Any]) -> tuple[Any, int]:
        """Run `statement` outside a transaction — one statement, one round trip, no BEGIN and
        ROLLBACK around it —: its first row (None: none) and the rows it changed. On a pooled
        psycopg session of the process for a psycopg database (a `psycopg.Error` when it
        fails), else on a connection of the engine."""
        if self._po_session_url is not None:
            with pgsession.pooled(self._po_session_url, share=True) as session:
                cursor = session.execute(statement.psycopg, params)
                return (cursor.fetchone() if cursor.description else None), cursor.rowcount
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            result = conn.execute(statement.text, params)
            return (result.first() if result.returns_rows else None), result.rowcount

    def _init_catalog(self) -> None:
        """pyiceberg's checks as one probe when the catalog tables are there with the v1 schema
        (the usual case); otherwise pyiceberg's own (which create missing tables, or detect a v0
        schema). The psycopg dialect's hstore lookup is skipped: no catalog column is hstore."""
        if self.properties.get("schema_version", "v0") not in ("v0", "v1"):
            super()._init_catalog()  # pyiceberg's error for the bad value
            return
        dialect: Any = self.engine.dialect
        if getattr(dialect, "use_native_hstore", False):
            dialect.use_native_hstore = False
        ns = self._po_probe_namespace
        try:
            if ns is None:
                self._po_run(_PROBE, {})
            else:
                under = ns.replace("!", "!!").replace("_", "!_").replace("%", "!%") + ".%"
                row, _ = self._po_run(
                    _PROBE_NAMESPACE, {"catalog": self.name, "namespace": ns, "under": under}
                )
                if row is not None and row[1]:
                    self._po_namespaces.add(ns)
        except (OperationalError, ProgrammingError, psycopg.Error) as exc:
            if not isinstance(exc, (UndefinedTable, UndefinedColumn)):
                # not a catalog missing its tables (pyiceberg creates them below) but a URL
                # psycopg does not take as SQLAlchemy does, or a database that is down: the
                # engine runs every statement, and reports the failure as before
                self._po_session_url = None
            super()._init_catalog()
            return
        self._schema_version = "v1"

    def knows_namespace(self, namespace: str) -> bool:
        """Whether this handle has seen `namespace` exist (its opening probe, or a check)."""
        return namespace in self._po_namespaces

    def namespace_exists(self, identifier: str | Identifier) -> bool:
        exists = super().namespace_exists(identifier)
        if exists:
            with suppress(NoSuchNamespaceError):
                self._po_namespaces.add(Catalog.namespace_to_string(identifier))
        return exists

    def _po_remember(self, location: str, metadata: TableMetadata) -> None:
        with self._po_guard:
            self._po_parsed[location] = metadata
            self._po_parsed.move_to_end(location)
            while len(self._po_parsed) > _CACHED_VERSIONS:
                self._po_parsed.popitem(last=False)

    def load_table(self, identifier: str | Identifier) -> Table:
        """pyiceberg's lookup as one plain query: its ORM select costs ~10 ms of statement
        compiling and mapper setup on a process's first load (every Dagster step, every CLI
        command). The same rows match (`_iceberg_type_filter`: tables, not views, on a v1
        schema)."""
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        table_name = Catalog.table_name_from(identifier)
        query = _LOAD_V1 if self._schema_version == "v1" else _LOAD
        row, _ = self._po_run(
            query,
            {
                "catalog": self.name,
                "namespace": namespace,
                "table": table_name,
                "kind": ICEBERG_TABLE_TYPE,
            },
        )
        if row is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{table_name}")
        return self._po_table(namespace, table_name, row[0])

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        return self._po_table(
            orm_table.table_namespace, orm_table.table_name, orm_table.metadata_location
        )

    def _po_table(self, namespace: str, table_name: str, location: str | None) -> Table:
        """The table at metadata file `location`, parsed once per location (as pyiceberg's
        `_convert_orm_to_iceberg` otherwise)."""
        if not location:
            raise NoSuchTableError("Table property metadata_location is missing")
        if not namespace or not table_name:
            raise NoSuchTableError(f"Table {namespace}.{table_name}: its name is missing")
        with self._po_guard:
            metadata = self._po_parsed.get(location)
        if metadata is None:
            io = load_file_io(properties=self.properties, location=location)
            metadata = FromInputFile.table_metadata(io.new_input(location))
            self._po_remember(location, metadata)
        return Table(
            identifier=(*Catalog.identifier_to_tuple(namespace), table_name),
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
        """pyiceberg's commit, without loading the table again when `table` is still current:
        its changes are staged on `table`'s metadata and its row moves only if it still points
        at `table`'s metadata file (one statement). When another commit moved it since,
        pyiceberg's own commit runs (it reloads the table, checks the requirements against the
        current metadata, and commits or refuses), and the file staged here is removed."""
        response = self._po_commit_loaded(table, requirements, updates)
        if response is None:
            response = super().commit_table(table, requirements, updates)
        self._po_remember(response.metadata_location, response.metadata)
        return response

    def _po_commit_loaded(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse | None:
        """The commit against `table` as loaded; None when that is not the current row, or
        `table` is not as loaded: a create, a view of it (`tables.at_branch`: its metadata is
        not the file's — only metadata this handle parsed or committed, the very object, is
        committed against), or a dialect without reliable row counts."""
        if isinstance(table, StagedTable) or not table.metadata_location:
            return None
        with self._po_guard:
            loaded = self._po_parsed.get(table.metadata_location)
        if loaded is not table.metadata or not (
            self._po_session_url is not None or self.engine.dialect.supports_sane_rowcount
        ):
            return None
        identifier = table.name()
        staged = self._update_and_stage_table(table, identifier, requirements, updates)
        if staged.metadata == table.metadata:
            # nothing to change here, but the requirements hold only if `table` is current:
            # pyiceberg's commit checks them against the current row (and then does nothing)
            return None
        self._write_metadata(
            metadata=staged.metadata, io=staged.io, metadata_path=staged.metadata_location
        )
        _, moved = self._po_run(
            _MOVE,
            {
                "location": staged.metadata_location,
                "previous": table.metadata_location,
                "catalog": self.name,
                "namespace": Catalog.namespace_to_string(Catalog.namespace_from(identifier)),
                "table": Catalog.table_name_from(identifier),
            },
        )
        if moved < 1:
            with suppress(OSError):
                staged.io.delete(staged.metadata_location)
            return None
        return _response(staged.metadata, staged.metadata_location)


class AssertUnchanged(ValidatableTableRequirement):
    """The table's metadata must be the very version a commit was planned on: its last update
    time and its latest metadata-log entry, which every commit changes (a property-only one
    too, which no Iceberg REST requirement can assert). Checked where the catalog validates the
    requirements itself (the SQL catalog: a commit that finds its row moved since
    `table` re-checks them against the current metadata); a REST catalog would refuse the
    unknown type, so it is never sent there (`requires_unchanged`)."""

    type: Literal["po-assert-unchanged"] = Field(default="po-assert-unchanged")
    last_updated_ms: int
    previous: str | None

    @classmethod
    def of(cls, metadata: TableMetadata) -> AssertUnchanged:
        """The requirement that the table still be at `metadata`."""
        log = metadata.metadata_log
        return cls(
            last_updated_ms=metadata.last_updated_ms,
            previous=log[-1].metadata_file if log else None,
        )

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        """Raise `CommitFailedException` unless `base_metadata` is the planned version."""
        log = base_metadata.metadata_log if base_metadata is not None else []
        if (
            base_metadata is None
            or base_metadata.last_updated_ms != self.last_updated_ms
            or (log[-1].metadata_file if log else None) != self.previous
        ):
            raise CommitFailedException(
                "Requirement failed: the table changed since this write was planned"
            )


def requires_unchanged(catalog: Catalog) -> bool:
    """Whether `catalog` validates a commit's requirements itself, so `AssertUnchanged` may be
    staged (any catalog but REST, which sends them to the server). A process that never
    imported pyiceberg's REST catalog holds none: its module (with `requests` and urllib3,
    ~0.2 s of imports) is not imported to ask."""
    rest = sys.modules.get("pyiceberg.catalog.rest")
    return rest is None or not isinstance(catalog, rest.RestCatalog)


def _response(metadata: TableMetadata, location: str) -> CommitTableResponse:
    """pyiceberg's `CommitTableResponse` (its field's alias is `metadata-location`)."""
    return CommitTableResponse.model_validate({"metadata": metadata, "metadata-location": location})


def open_catalog(
    name: str,
    config: Mapping[str, str],
    *,
    namespace: str | None = None,
    where: Callable[[str], str],
) -> Catalog:
    """The pyiceberg catalog `config` describes — exactly those properties: nothing is merged
    from `PYICEBERG_CATALOG__<NAME>__*` variables or `.pyiceberg.yaml` (pyiceberg's
    `load_catalog` would; the environment's route gets them from `settings`, which reads those
    sources itself) — with `namespace` created in it when given.

    Its tables' FileIO is `file_io.ObjectStoreFileIO` unless `config` names one (`py-io-impl`).
    The class is the one pyiceberg's `load_catalog` picks (`py-catalog-impl`, `type`, else the
    type the `uri` implies); a `type: sql` catalog is `FlatSqlCatalog`, retried (two processes
    creating its tables race), and a Postgres one gets `pool_pre_ping` (a connection the server
    dropped is replaced before use). Errors are one line naming `where(key)`, the setting a key
    came from: `SettingsError` for a malformed config or a database that refuses the `uri` (no
    such database, authentication failed) or a REST catalog that refuses the credentials,
    `PostgresUnavailable` / `CatalogUnavailable` (retryable) for one that is down."""
    try:
        catalog = _load(name, config, namespace=namespace, where=where)
        if namespace is not None:
            ensure_namespace(catalog, namespace)
    except Exception as exc:
        mapped = from_third_party(exc)
        if isinstance(mapped, CatalogRefused):  # the credentials are a setting to change
            raise SettingsError(where("uri"), str(mapped)) from exc
        if isinstance(mapped, CatalogUnavailable):
            raise CatalogUnavailable(f"{where('uri')}: {mapped}") from exc
        raise
    return catalog


def _load(
    name: str, config: Mapping[str, str], *, namespace: str | None, where: Callable[[str], str]
) -> Catalog:
    from sqlalchemy.exc import DBAPIError

    props = dict(config)
    props.setdefault(PY_IO_IMPL, FILE_IO)  # one PUT a small file, connections reused (file_io.py)
    if props.get("type") == "sql" or str(props.get("uri", "")).startswith("postgresql"):
        props.setdefault("pool_pre_ping", "true")
    try:
        if props.get("type") == "sql" and "py-catalog-impl" not in props:
            props.pop("type")
            for attempt in range(3):
                try:
                    return FlatSqlCatalog(name, probe_namespace=namespace, **props)
                except OperationalError:
                    raise  # cannot connect: racing again changes nothing
                except DBAPIError:
                    if attempt == 2:
                        raise
        return _construct(name, props, where=where)
    except OperationalError as exc:
        raise connect_failure(exc, setting=where("uri"), url=str(props.get("uri", ""))) from exc
    except ValueError as exc:
        raise SettingsError(where("type"), one_line(exc)) from exc


def _construct(name: str, props: dict[str, str], *, where: Callable[[str], str]) -> Catalog:
    """The catalog class `load_catalog` would pick, built on `props` alone (no configuration
    merged underneath)."""
    from pyiceberg.catalog import AVAILABLE_CATALOGS, CatalogType, infer_catalog_type

    impl = props.get("py-catalog-impl")
    if impl is not None:
        module_name, _, class_name = impl.rpartition(".")
        try:
            catalog_class = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise SettingsError(
                where("py-catalog-impl"), f"cannot import {impl!r}: {one_line(exc)}"
            ) from exc
        loaded = catalog_class(name, **props)
        if not isinstance(loaded, Catalog):
            raise SettingsError(where("py-catalog-impl"), f"{impl!r} is not a pyiceberg Catalog")
        return loaded
    raw_type = props.get("type")
    conf: dict[str, Any] = dict(props)  # pyiceberg's RecursiveDict
    catalog_type = CatalogType(raw_type.lower()) if raw_type else infer_catalog_type(name, conf)
    if catalog_type is None:  # pragma: no cover - infer_catalog_type raises instead
        raise SettingsError(where("uri"), "cannot tell the catalog type; set type")
    if catalog_type is CatalogType.REST:  # signed without botocore where it can be
        from pipeline_output.stores.iceberg.table.rest_catalog import SignedRestCatalog

        return SignedRestCatalog(name, **props)
    return AVAILABLE_CATALOGS[catalog_type](name, props)


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create `namespace` unless it exists (or a `FlatSqlCatalog` handle has seen it exist); a
    concurrent creator winning the race is fine."""
    if isinstance(catalog, FlatSqlCatalog) and catalog.knows_namespace(namespace):
        return
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise
