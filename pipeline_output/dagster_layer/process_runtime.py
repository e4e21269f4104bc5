"""The per-process runtimes of the Dagster layer and the CLI: `runtime.connect` built once per
configuration and cached for the process.

`get_runtime()` is the zero-config default: the settings (control plane, catalog, namespace,
default mode, the arm `dual` reads from) read from the environment when it is first called (never
at import time), with optional overrides (a Component's `namespace:` wins over
`PIPELINE_OUTPUT_NAMESPACE`). `cached_runtime(key, build)` caches any other runtime — the one a
`PipelineOutputResource` describes (`resource.py`) — so Dagster's run workers, the CLI and tests
each connect once per configuration.

`freeze_long_lived` moves what the process holds into the collector's permanent generation
(`gc.freeze()`), once when the definitions are built and once when the runtime is: the imported
libraries (Dagster, pyiceberg, pyarrow, polars, SQLAlchemy ...) are several hundred thousand
objects that live as long as the process, and every full garbage collection — during a run, and
the ones the interpreter runs at exit — walked them all: in a window run's worker process about
0.8 CPU-s of ~4.5 (benchmarks/README.md, "Windows at production cadence"). Objects created later
are collected as usual. Before that, the first use of the public API imports the libraries with
the collector paused and freezes them too (`infra/collector.py`).
"""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections.abc import Callable

from pipeline_output.infra.settings import (
    Settings,
    check_namespace,
    default_mode,
    dual_read_arm,
    get_settings,
)
from pipeline_output.services.runtime import Runtime, connect
from pipeline_output.stores.iceberg.table.catalog import open_catalog

_lock = threading.Lock()
_cache: dict[str, Runtime] = {}
_frozen: set[str] = set()


def freeze_long_lived(stage: str) -> None:
    """`gc.freeze()` once per process and `stage` (`definitions`, `runtime`): what the process
    holds now lives as long as it does, so no garbage collection walks it again."""
    with _lock:
        if stage in _frozen:
            return
        _frozen.add(stage)
    gc.freeze()


def get_runtime(
    settings: Settings | None = None,
    *,
    namespace: str | None = None,
    mode: str | None = None,
    dual_reads_from: str | None = None,
) -> Runtime:
    """The runtime for `settings` (default: the environment now), built once per process; a given
    `namespace`, default `mode` or `dual_reads_from` wins over the environment's."""
    settings = settings or get_settings()
    if namespace is not None:
        check_namespace(namespace, setting="namespace")
        settings = dataclasses.replace(settings, namespace=namespace)
    project_mode = mode or default_mode()
    dual = dual_reads_from or dual_read_arm()
    key = repr(("settings", settings, project_mode, dual))

    def build() -> Runtime:
        # `connect` creates the namespace: the catalog is opened without (`settings_catalog`
        # would create it too, a second round trip in every run worker)
        catalog = open_catalog(
            settings.catalog_name, settings.catalog_properties(), where=settings.catalog_setting
        )
        return connect(
            pg_url=settings.control_plane_url(),
            catalog=catalog,
            namespace=settings.namespace,
            catalog_name=settings.catalog_name,
            default_mode=project_mode,  # type: ignore[arg-type]
            dual_reads_from=dual,  # type: ignore[arg-type]
        )

    return cached_runtime(key, build)


def cached_runtime(key: str, build: Callable[[], Runtime]) -> Runtime:
    """The runtime cached under `key` in this process, built by `build` on first use."""
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            return cached
        runtime = build()
        _cache[key] = runtime
    freeze_long_lived("runtime")
    return runtime


def reset_runtime() -> None:
    """Forget cached runtimes (tests that change the environment call this)."""
    with _lock:
        _cache.clear()


__all__ = ["Runtime", "cached_runtime", "freeze_long_lived", "get_runtime", "reset_runtime"]
