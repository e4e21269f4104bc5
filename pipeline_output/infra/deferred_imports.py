"""Library modules imported at the top of a library that uses them on rare paths only, loaded on
first use instead.

pyiceberg's `pyiceberg.io.pyarrow` — the statistics helpers every data file write uses, and the
FileIO of local tables — imports `pyarrow.dataset` at its top, which imports pandas: ~50 MB of
resident memory (of ~200 MB once the table maintenance path is imported), for its Arrow scan
(`ArrowScan`, positional delete files) alone. Its other uses of the module are annotations, not
evaluated (`from __future__ import annotations`). Table maintenance and writes read with polars
and never touch it: `defer("pyarrow.dataset")` puts a stand-in module in `sys.modules` (and on
`pyarrow`), and the real module is imported on the first attribute anyone reads from it — the
stand-in then forwards every attribute, so a module that bound it (`import pyarrow.dataset as ds`)
sees the real one. `pipeline_output.stores.iceberg` defers it when imported, before any of its
modules imports pyiceberg's (benchmarks/results/small-files-maintenance.md, "Peak memory of the
partitioned compaction").
A module already imported is left as it is.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

DEFERRED = ("pyarrow.dataset",)


class _Deferred(types.ModuleType):
    """The stand-in of a module not imported yet: imports it on the first attribute read."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_deferred_lock"] = threading.RLock()
        self.__dict__["_deferred_real"] = None

    def _deferred_load(self) -> types.ModuleType:
        with self.__dict__["_deferred_lock"]:
            real = self.__dict__["_deferred_real"]
            if real is None:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                try:
                    real = importlib.import_module(self.__name__)
                except BaseException:
                    sys.modules.setdefault(self.__name__, self)
                    raise
                self.__dict__["_deferred_real"] = real
            return real  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._deferred_load(), name)

    def __dir__(self) -> list[str]:
        return dir(self._deferred_load())


def defer(name: str) -> None:
    """Import the module `name` (a submodule of a package) on its first use, not when it is
    imported; nothing when it is imported already."""
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    package = importlib.import_module(parent)
    if name in sys.modules:  # the package imported it
        return
    stand_in = _Deferred(name)
    sys.modules[name] = stand_in
    setattr(package, child, stand_in)


def loaded(name: str) -> bool:
    """Whether the module `name` was really imported (not only deferred)."""
    module = sys.modules.get(name)
    if isinstance(module, _Deferred):
        return module.__dict__["_deferred_real"] is not None
    return module is not None


def defer_all() -> None:
    """Defer every module of `DEFERRED`."""
    for name in DEFERRED:
        defer(name)


__all__ = ["DEFERRED", "defer", "defer_all", "loaded"]
