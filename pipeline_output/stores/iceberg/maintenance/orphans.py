"""What a table references, and the files under its location that nothing references (orphans).

Owns the reachability rule table maintenance and `pipeline-output doctor` share. A file under a
table's location is *referenced* when it is

- live (added or existing) in a manifest of a snapshot the table still has — data files and
  delete files alike (a file only a `deleted` entry names belonged to an expired snapshot),
- a manifest or the manifest list of such a snapshot,
- the current `metadata.json` or one in its metadata log, or a statistics file.

Everything else under the location is an *orphan* once it is older than the grace period: files
of failed or killed writes, files expired snapshots referenced. A file younger than the grace
period is never touched, nor a `metadata.json` whose version is above the table's current one (a
commit under way). `remove_orphans` deletes only what is still unreferenced once no write of the
project is in flight (`commit.py`): a write in progress, however long, keeps all its files.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.snapshot.commit import DEFAULT_WAIT_S, quiesced
from pipeline_output.stores.iceberg.table.tables import READ_THREADS

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables

DEFAULT_GRACE_S = 3600.0


@dataclass(frozen=True)
class OrphanResult:
    """What an orphan sweep of one table removed (or, with `dry_run`, found)."""

    dataset: str
    table: str
    dry_run: bool
    files: int
    bytes: int
    duration_s: float
    wait_s: float = 0.0  # waiting for the writes in flight to end (and the writer lock)

    def describe(self) -> str:
        """One line for logs and the CLI."""
        verb = "found" if self.dry_run else "removed"
        return f"orphans: {verb} {self.files} file(s), {self.bytes} bytes"


@dataclass(frozen=True)
class Orphan:
    """One unreferenced file."""

    table: str
    path: str
    size: int
    age_s: float
    # The table FileIO's properties (endpoint, credentials of an object store): needed to delete
    # the file later. Not compared, never printed.
    io_properties: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)


class ManifestReader:
    """Reads each manifest's live file paths once (a manifest is shared by many snapshots)."""

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self._live: dict[str, set[str]] = {}
        self.locations: dict[str, str] = {}  # normalized path -> the location as referenced

    def files_of(self, snapshots: Iterable[Snapshot]) -> set[str]:
        """Manifest lists, manifests and live data/delete files of `snapshots` (normalized)."""
        out: set[str] = set()
        manifests: dict[str, ManifestFile] = {}
        for snapshot in snapshots:
            out.add(self._seen(snapshot.manifest_list))
            try:
                for manifest in snapshot.manifests(self.io):
                    manifests.setdefault(manifest.manifest_path, manifest)
            except (OSError, ValueError):
                continue  # its manifest list is gone (a concurrent cleanup): nothing to add
        todo = [m for path, m in manifests.items() if path not in self._live]
        if todo:
            with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(todo))) as pool:
                for manifest, paths in zip(todo, pool.map(self._read, todo), strict=True):
                    self._live[manifest.manifest_path] = paths
        for path in manifests:
            out.add(self._seen(path))
            out |= self._live[path]
        return out

    def _read(self, manifest: ManifestFile) -> set[str]:
        try:
            entries = manifest.fetch_manifest_entry(self.io, discard_deleted=True)
        except (OSError, ValueError):
            return set()
        return {self._seen(e.data_file.file_path) for e in entries}

    def _seen(self, location: str) -> str:
        key = norm(location)
        self.locations[key] = location
        return key


def referenced(table: Table, reader: ManifestReader | None = None) -> set[str]:
    """Every file the table references (module docstring), as `norm` paths."""
    reader = reader or ManifestReader(table.io)
    meta = table.metadata
    paths = reader.files_of(meta.snapshots)
    paths.add(norm(table.metadata_location))
    paths.update(norm(entry.metadata_file) for entry in meta.metadata_log)
    paths.update(norm(s.statistics_path) for s in meta.statistics)
    paths.update(norm(s.statistics_path) for s in getattr(meta, "partition_statistics", []))
    return paths


def norm(path: str) -> str:
    """A location as the filesystem lists it: a local path, or `bucket/key` for object stores."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return path.removeprefix("file://")
    return f"{parsed.netloc}{parsed.path}"


def filesystem(
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


def table_orphans(
    table: Table,
    *,
    grace_s: float = DEFAULT_GRACE_S,
    data_only: bool = False,
    reader: ManifestReader | None = None,
) -> list[Orphan]:
    """Unreferenced files under the table's location older than `grace_s` seconds (as listed now:
    `still_orphans` re-checks them once no write is in flight).

    `data_only`: only Parquet files under `data/` (what `pipeline-output doctor` looks at).
    `reader`: manifests already read (kept for the re-check)."""
    now = time.time()
    props = dict(table.io.properties)
    location = table.location().rstrip("/")
    root = location + "/data" if data_only else location
    fs, base = filesystem(root, props)
    prefix = location[: len(location) - len(norm(location))]  # "s3://" or ""
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError:
        return []
    known = referenced(table, reader)
    version = metadata_version(table.metadata_location)
    out = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        if data_only and not info.path.endswith(".parquet"):
            continue
        if norm(info.path) in known or _committing(info.path, version):
            continue
        age = now - (info.mtime.timestamp() if info.mtime is not None else now)
        if age < grace_s:
            continue
        path = info.path if prefix in ("", "file://") else prefix + info.path
        out.append(
            Orphan(
                table=".".join(table.name()),
                path=path,
                size=info.size or 0,
                age_s=age,
                io_properties=props,
            )
        )
    return out


def remove_orphans(
    store: HasTables,
    spec: DatasetSpec,
    *,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    wait_s: float = DEFAULT_WAIT_S,
) -> OrphanResult:
    """Delete every unreferenced file under the dataset's table location (data and metadata)
    older than `grace_s` seconds; `dry_run`: only count them (as listed: the count may include
    files of writes in progress).

    The files of a write in progress are never deleted, whatever `grace_s`: the table is listed
    first, then the files still unreferenced once no write of the project is in flight are
    deleted (`commit.quiesced`). Waits at most `wait_s` for the writes in flight to end, else
    `LockUnavailable` and nothing is deleted."""
    from pipeline_output.errors import DatasetNotWritten

    started = time.perf_counter()
    table = store.tables.load(spec)
    if table is None:
        raise DatasetNotWritten(f"dataset {spec.name!r} has no Iceberg table to sweep")
    reader = ManifestReader(table.io)
    found = table_orphans(table, grace_s=grace_s, reader=reader)
    waited = 0.0
    if found and not dry_run:
        found, waited = sweep_table(
            store,
            store.tables.table_name(spec),
            found,
            dataset=spec.name,
            wait_s=wait_s,
            reader=reader,
        )
    return OrphanResult(
        dataset=spec.name,
        table=store.tables.table_name(spec),
        dry_run=dry_run,
        files=len(found),
        bytes=sum(o.size for o in found),
        duration_s=time.perf_counter() - started,
        wait_s=waited,
    )


def sweep_table(
    store: HasTables,
    table: str,
    found: list[Orphan],
    *,
    dataset: str,
    wait_s: float = DEFAULT_WAIT_S,
    reader: ManifestReader | None = None,
) -> tuple[list[Orphan], float]:
    """Delete those of `found` (listed earlier under `table`, `namespace.name`) that are still
    orphans once no write is in flight; the ones deleted, and the seconds waited."""
    with quiesced(store, table, dataset=dataset, wait_s=wait_s) as waited:
        current = _load(store, table)
        still = still_orphans(current, found, reader) if current is not None else []
    # Deleted after the locks: a write starting now writes new files or references files the
    # table already references, so none of `still` can become referenced (commit.py).
    return still[: delete_orphans(still)], waited


def still_orphans(
    table: Table, found: Iterable[Orphan], reader: ManifestReader | None = None
) -> list[Orphan]:
    """Those of `found` that `table`, as it is now, does not reference."""
    known = referenced(table, reader)
    version = metadata_version(table.metadata_location)
    return [o for o in found if norm(o.path) not in known and not _committing(o.path, version)]


def _load(store: HasTables, table: str) -> Table | None:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return store.tables.catalog.load_table(table)
    except NoSuchTableError:
        return None


_METADATA_FILE = re.compile(r"(?:^|/)(\d+)-[^/]*\.metadata\.json$")


def metadata_version(location: str) -> int:
    """The version of a `<version>-<uuid>[.gz].metadata.json` file (-1: not such a name)."""
    match = _METADATA_FILE.search(location)
    return int(match.group(1)) if match else -1


def _committing(path: str, current: int) -> bool:
    """A metadata file newer than the table's current one: a commit under way (never an orphan;
    once a later commit reaches its version it is an orphan like any other)."""
    return metadata_version(path) > current >= 0


def delete_orphans(orphans: Iterable[Orphan]) -> int:
    """Delete the given orphan files; returns how many were removed."""
    removed = 0
    for orphan in orphans:
        fs, path = filesystem(orphan.path, orphan.io_properties)
        try:
            fs.delete_file(path)
            removed += 1
        except FileNotFoundError:
            continue
    return removed


def delete_paths(io: FileIO, paths: Iterable[str]) -> int:
    """Delete files through the table's FileIO (in parallel); returns how many were deleted."""

    def one(path: str) -> bool:
        try:
            io.delete(path)
            return True
        except (OSError, ValueError):
            return False

    todo = list(paths)
    if not todo:
        return 0
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(todo))) as pool:
        return sum(pool.map(one, todo))
