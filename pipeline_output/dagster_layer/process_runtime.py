"""The per-process runtime of the Dagster layer and the CLI: `core_runtime.connect` over the
settings (control plane, catalog, namespace, default mode, the arm `dual` reads from).

Built lazily on first use (never at import time) and cached per settings value, so Dagster's run
workers, the CLI and tests each resolve the environment when they actually run.

`freeze_long_lived` moves what the process holds into the collector's permanent generation
(`gc.freeze()`), once when the definitions are built and once when the runtime is: the imported
libraries (Dagster, pyiceberg, pyarrow, polars, SQLAlchemy ...) are several hundred thousand
objects that live as long as the process, and every full garbage collection — during a run, and
the ones the interpreter runs at exit — walked them all: in a window run's worker process about
0.8 CPU-s of ~4.5 (benchmarks/README.md, "Windows at production cadence"). Objects created later
are collected as usual.
"""

from __future__ import annotations

import gc
import threading

from pipeline_output.infra.settings import Settings, default_mode, dual_read_arm, get_settings
from pipeline_output.services.runtime import Runtime, connect, settings_catalog

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


def get_runtime(settings: Settings | None = None) -> Runtime:
    """The runtime for `settings` (default: the environment now), built once per process."""
    settings = settings or get_settings()
    with _lock:
        cached = _cache.get(repr(settings))
        if cached is not None:
            return cached
        runtime = connect(
            pg_url=settings.control_plane_url(),
            catalog=settings_catalog(settings),
            namespace=settings.namespace,
            catalog_name=settings.catalog_name,
            default_mode=default_mode(),  # type: ignore[arg-type]
            dual_reads_from=dual_read_arm(),  # type: ignore[arg-type]
        )
        _cache[repr(settings)] = runtime
    freeze_long_lived("runtime")
    return runtime


def reset_runtime() -> None:
    """Forget cached runtimes (tests that change the environment call this)."""
    with _lock:
        _cache.clear()


__all__ = ["Runtime", "freeze_long_lived", "get_runtime", "reset_runtime"]
