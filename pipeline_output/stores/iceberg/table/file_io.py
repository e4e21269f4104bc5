"""`ObjectStoreFileIO`: the FileIO of every table of a catalog the project opens — pyiceberg's
pyarrow FileIO, with fewer object-store requests per write.

pyiceberg 0.12 opens every S3 output stream as a multipart upload (pyarrow's `S3FileSystem`
without `allow_delayed_open`): each file a write adds — data file, delete file, manifests, manifest
list — costs three requests (create, one part, complete) where one PUT does. With
`allow_delayed_open` a file smaller than one part is one PUT (a larger one is still a multipart
upload, started when its first part is full).

pyiceberg also builds a new `S3FileSystem` (a new AWS client and connection pool) for every table
it loads, so each write's first requests open new connections. Here one file system serves every
table of the process whose FileIO has the same `s3.*` / `client.*` properties (the only ones the
file system is built from): its connections are reused from write to write (a forked child
process builds its own).

Local files, and every other scheme, are read and written exactly as by `PyArrowFileIO`.
`open_catalog` (`catalog.py`) gives a catalog this FileIO unless its configuration names one
(`py-io-impl`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO

IMPL = f"{__name__}.ObjectStoreFileIO"  # the `py-io-impl` value naming it
_CACHED = 8  # file systems kept (credentials vended per table make new ones)
_shared: OrderedDict[tuple[Any, ...], FileSystem] = OrderedDict()
_guard = threading.Lock()


class ObjectStoreFileIO(PyArrowFileIO):
    """`PyArrowFileIO` whose S3 file system uploads a small file as one PUT and is shared by
    every FileIO of the process with the same S3 properties."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        key = (
            os.getpid(),  # a forked child builds its own (an AWS client is not fork-safe)
            netloc,
            *sorted(
                (k, str(v)) for k, v in self.properties.items() if k.startswith(("s3.", "client."))
            ),
        )
        with _guard:
            found = _shared.get(key)
            if found is not None:
                _shared.move_to_end(key)
                return found
        made = _delayed_open(super()._initialize_s3_fs(netloc), self.properties)
        with _guard:
            _shared[key] = made
            while len(_shared) > _CACHED:
                _shared.popitem(last=False)
        return made


def _delayed_open(fs: FileSystem, properties: Any) -> FileSystem:
    """`fs` (pyiceberg's S3 file system) with `allow_delayed_open`, every other option kept
    (pyarrow's own reconstruction arguments); as it is when a retry strategy was configured (the
    one option those arguments do not carry)."""
    if not isinstance(fs, S3FileSystem) or properties.get("s3.retry-strategy-impl"):
        return fs
    rebuild, (options,) = fs.__reduce__()
    made: FileSystem = rebuild({**options, "allow_delayed_open": True})
    return made
