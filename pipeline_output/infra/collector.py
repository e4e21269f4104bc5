"""The garbage collector while the package's libraries are imported.

The first use of the public API (`from pipeline_output import dataset, build_definitions`) imports
pyiceberg with pyarrow's dataset module (which imports pandas and numpy), SQLAlchemy, psycopg and
the project's own modules: several hundred thousand objects, nearly all of them living as long as
the process. Each full collection during those imports walks every object the process holds
(Dagster's included) and finds next to nothing to free; in a window run's worker process the
collector took ~0.5 CPU-s of ~3.5, half of it during this import (benchmarks/README.md, "Windows at
production cadence").

`imports_paused()` disables automatic collection for the duration of such an import and then moves
what the process holds into the permanent generation (`gc.freeze()`), as
`dagster_layer/resource.py` does once the definitions are built: later collections walk
only objects created afterwards. A process that disabled the collector itself is left alone;
the collector is enabled again however the import ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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


__all__ = ["imports_paused"]
