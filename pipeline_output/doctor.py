"""Doctor: find (and optionally remove) orphan data files in the warehouse.

A failed or killed write can leave data files that no snapshot references (files are written
before the single commit). An orphan is a file under a table's `data/` directory that no snapshot
of the table — current or historical — references, and that is older than a grace period (so a
write in progress, whose files are not committed yet, is never touched). Pure core (no Dagster).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

DEFAULT_GRACE_S = 3600.0


@dataclass(frozen=True)
class Orphan:
    """One unreferenced data file."""

    table: str
    path: str
    size: int
    age_s: float
    # The table FileIO's properties (endpoint, credentials of an object store): needed to delete
    # the file later. Not compared, never printed.
    io_properties: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)


def referenced_files(table: Table) -> set[str]:
    """Every data/delete file path referenced by any snapshot of `table`."""
    paths: set[str] = set()
    io = table.io
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(io):
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                paths.add(_norm(entry.data_file.file_path))
    return paths


def _norm(path: str) -> str:
    """A location as the filesystem lists it: a local path, or `bucket/key` for object stores."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return path.removeprefix("file://")
    return f"{parsed.netloc}{parsed.path}"


def _filesystem(
    location: str, properties: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and in-filesystem path of `location`.

    Object stores (s3://, gs://, ...) are opened the way the table's own FileIO opens them, from
    its properties (`s3.endpoint`, credentials, region, ...), so a non-AWS endpoint works.
    """
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return pafs.LocalFileSystem(), parsed.path if parsed.scheme else location
    props = dict(properties or {})
    scheme, netloc, path = PyArrowFileIO.parse_location(location, props)
    return PyArrowFileIO(props).fs_by_scheme(scheme, netloc), path


def find_orphans(
    catalog: Catalog, namespace: str, *, grace_s: float = DEFAULT_GRACE_S
) -> list[Orphan]:
    """Orphan data files of every table in `namespace`, older than `grace_s`."""
    now = time.time()
    out: list[Orphan] = []
    for identifier in catalog.list_tables(namespace):
        table = catalog.load_table(identifier)
        referenced = referenced_files(table)
        props = dict(table.io.properties)
        location = table.location().rstrip("/")
        fs, base = _filesystem(location + "/data", props)
        prefix = location[: len(location) - len(_norm(location))]  # "s3://" or ""
        try:
            infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        except OSError:
            continue
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
                continue
            if _norm(info.path) in referenced:
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else now
            age = now - mtime
            if age < grace_s:
                continue
            path = info.path if prefix in ("", "file://") else prefix + info.path
            out.append(
                Orphan(
                    table=".".join(identifier),
                    path=path,
                    size=info.size or 0,
                    age_s=age,
                    io_properties=props,
                )
            )
    return out


def remove_orphans(orphans: list[Orphan]) -> int:
    """Delete the given orphan files; returns how many were removed."""
    removed = 0
    for orphan in orphans:
        fs, path = _filesystem(orphan.path, orphan.io_properties)
        try:
            fs.delete_file(path)
            removed += 1
        except FileNotFoundError:
            continue
    return removed
