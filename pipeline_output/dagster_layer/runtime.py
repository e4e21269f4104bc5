"""The per-process runtime: settings resolved once into a catalog, stores and a publisher.

Built lazily on first use (never at import time) and cached per settings value, so Dagster's run
workers, the CLI and tests each resolve the environment when they actually run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pyiceberg.catalog import Catalog

from pipeline_output import pgsession
from pipeline_output.ledger.control_plane import Ledger
from pipeline_output.ledger.migrations import migrate
from pipeline_output.ledger.window_ledger import WindowLedger
from pipeline_output.publish import Publisher
from pipeline_output.settings import Settings, default_mode, dual_read_arm, get_settings
from pipeline_output.stores.iceberg import IcebergStore
from pipeline_output.stores.postgres import PostgresStore

_lock = threading.Lock()
_cache: dict[str, Runtime] = {}


@dataclass
class Runtime:
    """Resolved settings and the objects built from them."""

    settings: Settings
    pg_url: str
    catalog: Catalog
    iceberg: IcebergStore
    publisher: Publisher
    windows: WindowLedger

    @property
    def ledger(self) -> Ledger:
        """The control-plane ledger (deploys, flips, parity)."""
        ledger = self.publisher.ledger
        assert isinstance(ledger, Ledger)
        return ledger

    @property
    def postgres(self) -> PostgresStore:
        """The legacy arm."""
        store = self.publisher.postgres
        assert isinstance(store, PostgresStore)
        return store


def get_runtime(settings: Settings | None = None) -> Runtime:
    """The runtime for `settings` (default: the environment now), built once per process."""
    settings = settings or get_settings()
    with _lock:
        cached = _cache.get(repr(settings))
        if cached is not None:
            return cached
        pg_url = settings.control_plane_url()
        catalog = settings.catalog()
        from pipeline_output.locks import AdvisoryLock

        iceberg = IcebergStore(catalog, settings.namespace, lock=AdvisoryLock(pg_url))
        with pgsession.connect(pg_url) as conn:
            migrate(conn)
        ledger = Ledger(pg_url)
        postgres = PostgresStore(pg_url, ledger=ledger)
        publisher = Publisher(
            iceberg=iceberg,
            postgres=postgres,
            ledger=ledger,
            project_default=default_mode(),  # type: ignore[arg-type]
            dual_reads_from=dual_read_arm(),  # type: ignore[arg-type]
        )
        runtime = Runtime(
            settings=settings,
            pg_url=pg_url,
            catalog=catalog,
            iceberg=iceberg,
            publisher=publisher,
            windows=WindowLedger(pg_url),
        )
        _cache[repr(settings)] = runtime
        return runtime


def reset_runtime() -> None:
    """Forget cached runtimes (tests that change the environment call this)."""
    with _lock:
        _cache.clear()
