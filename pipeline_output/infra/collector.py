"""The garbage collector while the package's libraries are imported.

The first use of the public API (`from pipeline_output import dataset, build_definitions`) imports
pyiceberg with pyarrow (its dataset module, which imports pandas, only on its first use:
`infra/deferred_imports.py`), SQLAlchemy, psycopg and the project's own modules: several hundred
thousand objects, nearly all of them living as long as the process. Each full collection during those imports walks every object the process holds
(Dagster's included) and finds next to nothing to free; in a window run's worker process the
collector took ~0.5 CPU-s of ~3.5, half of it during this import (benchmarks/results/cadence.md).

`imports_paused()` disables automatic collection for the duration of such an import and then moves
what the process holds into the permanent generation (`gc.freeze()`), as
`dagster_layer/resource.py` does once the definitions are built: later collections walk
only objects created afterwards. A process that disabled the collector itself is left alone;
the collector is enabled again however the import ends.

`paused()` disables automatic collection for a block that builds many long-lived objects at once
— table maintenance decoding and re-encoding the manifest entries of tens of thousands of files:
each full collection walks every entry built so far and frees none of them, which made decoding
a manifest entry 4-5 times slower (benchmarks/results/small-files-maintenance.md).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_PAUSED = {"depth": 0, "enable": False}  # blocks inside `paused`; whether to enable at the end
_LOCK = threading.Lock()


@contextmanager
def imports_paused() -> Iterator[None]:
    """No automatic garbage collection inside the block; what the process holds at its end is
    frozen (`gc.freeze()`). Nested or with the collector already disabled: nothing changes."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


@contextmanager
def paused() -> Iterator[None]:
    """No automatic garbage collection inside the block. Nested or concurrent blocks (threads):
    until the last one ends; a collector the process disabled itself stays disabled."""
    with _LOCK:
        if _PAUSED["depth"] == 0:
            _PAUSED["enable"] = gc.isenabled()
            gc.disable()
        _PAUSED["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _PAUSED["depth"] -= 1
            if _PAUSED["depth"] == 0 and _PAUSED["enable"]:
                gc.enable()


__all__ = ["imports_paused", "paused"]
