"""The runtime: every object a publish needs, built for one control plane and one catalog.

`connect(pg_url=..., catalog=..., namespace="datasets")` is the public way to get it, from plain
Python; the Dagster layer's `get_runtime` builds its own with it too (from the settings). It checks
the control-plane URL, applies the pending control-plane migrations (idempotent; concurrent
callers migrate one after the other), loads the catalog (a pyiceberg `Catalog` as it is, or its
properties) and creates the namespace, then builds the Iceberg store, the legacy Postgres store,
the ledger (deploys, flips, parity, audits), the window ledger and the `Publisher` over them.
Nothing is cached: each call builds a new runtime. Pure core: no Dagster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from pyiceberg.catalog import Catalog

from pipeline_output.contract.spec import ARMS, MODES, Arm, Mode
from pipeline_output.errors import (
    InvalidArgument,
    MigrationError,
    PostgresUnavailable,
    from_third_party,
)
from pipeline_output.infra import pgsession
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.infra.settings import (
    Settings,
    check_libpq_url,
    check_namespace,
    mask_url,
    one_line,
    validate_catalog_properties,
)
from pipeline_output.ledger.control_plane import Ledger
from pipeline_output.ledger.migrations import migrate
from pipeline_output.ledger.window_ledger import WindowLedger
from pipeline_output.services.publish import Publisher
from pipeline_output.stores.iceberg import IcebergStore
from pipeline_output.stores.iceberg.table.catalog import ensure_namespace, open_catalog
from pipeline_output.stores.postgres import PostgresStore


@dataclass(frozen=True)
class Runtime:
    """The stores, ledgers and publisher of one control plane (`pg_url`) and one catalog (the
    stores and the ledger are the publisher's own, so there is one of each)."""

    pg_url: str
    catalog: Catalog
    namespace: str
    windows: WindowLedger
    publisher: Publisher

    @property
    def iceberg(self) -> IcebergStore:
        """The Iceberg store."""
        return self.publisher.iceberg

    @property
    def postgres(self) -> PostgresStore:
        """The legacy Postgres store."""
        assert self.publisher.postgres is not None  # `connect` gives the publisher both arms
        return self.publisher.postgres

    @property
    def ledger(self) -> Ledger:
        """The control plane's ledger (deploys, flips, parity, audits)."""
        assert isinstance(self.publisher.ledger, Ledger)
        return self.publisher.ledger


def connect(
    *,
    pg_url: str,
    catalog: Catalog | Mapping[str, str],
    namespace: str = "datasets",
    catalog_name: str = "default",
    default_mode: Mode = "pg",
    dual_reads_from: Arm = "pg",
) -> Runtime:
    """The runtime for the control-plane Postgres `pg_url` (a libpq URI) and `catalog`.

    `catalog` is a pyiceberg `Catalog`, or its properties (what `.pyiceberg.yaml` would hold,
    e.g. `{"type": "sql", "uri": "postgresql+psycopg://...", "warehouse": "file:///..."}`),
    loaded under `catalog_name`. The control-plane schema is migrated and `namespace` created when
    missing. `default_mode` is the mode of a dataset declared without one (`pg`: the legacy arm
    until flipped); `dual_reads_from` the arm reads of a `dual` dataset use.

    Errors: `SettingsError` for a malformed argument, `PostgresUnavailable` when the control plane
    (or a SQL catalog's database) cannot be reached, `MigrationError` when its schema cannot be
    migrated — never a raw driver error.
    """
    check_libpq_url(pg_url, setting="pg_url")
    check_namespace(namespace, setting="namespace")
    if default_mode not in MODES:
        raise InvalidArgument(f"default_mode {default_mode!r} is not one of {', '.join(MODES)}")
    if dual_reads_from not in ARMS:
        raise InvalidArgument(f"dual_reads_from {dual_reads_from!r} is not one of {ARMS}")
    _migrate(pg_url)
    loaded = _catalog(catalog, catalog_name=catalog_name, namespace=namespace)
    ledger = Ledger(pg_url)
    return Runtime(
        pg_url=pg_url,
        catalog=loaded,
        namespace=namespace,
        windows=WindowLedger(pg_url),
        publisher=Publisher(
            iceberg=IcebergStore(
                loaded,
                namespace,
                lock=AdvisoryLock(pg_url),
                change_consumers=ledger.consumed_log.consumed,
            ),
            postgres=PostgresStore(pg_url, ledger=ledger),
            ledger=ledger,
            project_default=default_mode,
            dual_reads_from=dual_reads_from,
        ),
    )


def _migrate(pg_url: str) -> None:
    """Apply the control plane's pending migrations (a no-op when none is pending), on this
    process's pooled session (the ledger's records then open no new connection)."""
    try:
        with pgsession.pooled(pg_url, connect_timeout=10) as conn:
            migrate(conn)
    except psycopg.OperationalError as exc:
        raise PostgresUnavailable(
            f"control plane {mask_url(pg_url)}: cannot connect: {one_line(exc)}"
        ) from exc
    except psycopg.Error as exc:
        raise MigrationError(
            f"control plane {mask_url(pg_url)}: cannot migrate its schema: {one_line(exc)}"
        ) from exc


def _catalog(catalog: Catalog | Mapping[str, str], *, catalog_name: str, namespace: str) -> Catalog:
    """`catalog` loaded (when given as properties), with `namespace` created in it."""
    try:
        if isinstance(catalog, Catalog):
            loaded = catalog
        elif isinstance(catalog, Mapping):
            props = {str(k).lower(): str(v) for k, v in catalog.items()}

            def where(key: str) -> str:
                return f"catalog[{key!r}]"

            validate_catalog_properties(catalog_name, props, where=where)
            loaded = open_catalog(catalog_name, props, where=where)
        else:
            raise InvalidArgument(
                f"catalog must be a pyiceberg Catalog or a mapping of its properties, got "
                f"{type(catalog).__name__}"
            )
        ensure_namespace(loaded, namespace)
    except Exception as exc:
        mapped: Any = from_third_party(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc
    return loaded


def settings_catalog(settings: Settings) -> Catalog:
    """The Iceberg catalog `settings` describe, with their namespace created in it."""
    return open_catalog(
        settings.catalog_name,
        settings.catalog_properties(),
        namespace=settings.namespace,
        where=settings.catalog_setting,
    )
