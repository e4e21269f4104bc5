"""`IcebergTables`: the datasets' tables in one namespace of one catalog — naming them, loading
them, creating a table with its first write, and the two locks every writer of a table takes (the
writer lock, `hold`; and the files lock, `advisory` for `snapshot/inflight.py`).

It is the part of the native arm every operation shares: the store's writes and reads, the
streaming replace and table maintenance all take an `IcebergTables` (or anything carrying one as
`.tables`, such as `IcebergStore`), never the store itself.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import polars as pl
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table, Transaction

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.infra.locks import AdvisoryLock, HeldLock, LockStats, iceberg_table
from pipeline_output.stores.iceberg.table.partitions import partition_spec
from pipeline_output.stores.iceberg.table.properties import DEFAULT_LOCK, TABLE_PROPERTIES
from pipeline_output.stores.schema import initial_schema


class IcebergTables:
    """The tables `<namespace>.<dataset name>` of `catalog`, and their locks.

    Same-table writers are serialized with a Postgres advisory lock (default: on the control-plane
    Postgres from settings, resolved on first use). `lock=None` opts out — every write then warns
    that concurrent writers are unsafe.
    """

    def __init__(self, catalog: Catalog, namespace: str, *, lock: Any = DEFAULT_LOCK) -> None:
        self.catalog = catalog
        self.namespace = namespace
        self._lock: AdvisoryLock | Any | None = lock
        self._namespace_checked = False

    def identifier(self, spec: DatasetSpec | str) -> tuple[str, str]:
        """The table identifier of a dataset."""
        name = spec if isinstance(spec, str) else spec.name
        return (self.namespace, name)

    def table_name(self, spec: DatasetSpec | str) -> str:
        """`namespace.name`, for display and metadata."""
        return ".".join(self.identifier(spec))

    def load(self, spec: DatasetSpec | str) -> Table | None:
        """The table, or None when it does not exist."""
        try:
            return self.catalog.load_table(self.identifier(spec))
        except NoSuchTableError:
            return None

    def advisory(self) -> AdvisoryLock | Any | None:
        """The advisory lock behind the table locks (the default one, on the control plane,
        resolved on first use); None when the store was built with `lock=None`."""
        if self._lock is DEFAULT_LOCK:
            from pipeline_output.infra.settings import get_settings

            self._lock = AdvisoryLock(get_settings().control_plane_url())
        return self._lock

    def hold(
        self, spec: DatasetSpec, *, on: HeldLock | None = None
    ) -> AbstractContextManager[LockStats]:
        """The table's writer lock, held for the block (on the session of `on`, the write's files
        lock, when given): every commit to the table happens under it."""
        lock = self.advisory()
        if lock is None:
            warnings.warn(
                f"dataset {spec.name!r}: IcebergStore(lock=None) — concurrent writers of "
                f"{self.table_name(spec)} are unsafe (no advisory lock)",
                stacklevel=3,
            )
            return nullcontext(LockStats(key=self.table_name(spec)))
        if on is not None and isinstance(lock, AdvisoryLock):
            return lock.hold(iceberg_table(self.table_name(spec)), on=on)
        return lock.hold(iceberg_table(self.table_name(spec)))  # type: ignore[no-any-return,unused-ignore]

    def ensure_namespace(self) -> None:
        """Create the namespace unless this handle has seen it exist."""
        if not self._namespace_checked:
            self.catalog.create_namespace_if_not_exists(self.namespace)
            self._namespace_checked = True

    def create_transaction(self, spec: DatasetSpec, frame: pl.DataFrame) -> Transaction:
        """The transaction that creates `spec`'s table for `frame` (schema, partition spec, sort
        order and table properties), committed with the table's first write."""
        self.ensure_namespace()
        schema, order = initial_schema(spec, frame)
        return self.catalog.create_table_transaction(
            self.identifier(spec),
            schema=schema,
            partition_spec=partition_spec(spec, schema),
            sort_order=order,
            properties=TABLE_PROPERTIES,
        )


class HasTables(Protocol):
    """Anything that carries a dataset namespace's tables (`IcebergStore`, `TableMaintenance`)."""

    @property
    def tables(self) -> IcebergTables: ...
