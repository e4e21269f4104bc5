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

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.infra.collector import paused
from pipeline_output.stores.iceberg.snapshot.commit import CHANGE_FILE, DEFAULT_WAIT_S, quiesced
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    EntryColumns,
    entry_columns,
    manifest_files,
)
from pipeline_output.stores.iceberg.table.tables import READ_THREADS

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables

DEFAULT_GRACE_S = 3600.0
_LOCAL = ("file:", "/")


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
    """Reads each manifest list and each manifest's entries once (a manifest is shared by many
    snapshots), with the path-only decoder (`manifest_decoding.entry_columns`). A manifest is
    not read when its counts say it holds none of the entries asked for (live ones; removed
    ones)."""

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self._entries: dict[str, EntryColumns] = {}  # statuses, snapshot ids, normalized paths
        self._lists: dict[str, list[ManifestFile] | None] = {}
        # normalized path -> the location as referenced, for those not plain local files (a
        # `/x` or `file:///x` location is deleted by its normalized path `/x`: `location`)
        self.locations: dict[str, str] = {}

    def location(self, path: str) -> str:
        """The location to delete the file of the normalized `path` by."""
        return self.locations.get(path, path)

    def files_of(self, snapshots: Iterable[Snapshot]) -> set[str]:
        """Manifest lists, manifests and live data/delete files of `snapshots` (normalized)."""
        out, manifests = self.metadata_of(snapshots)
        live = [m for m in manifests if m.has_added_files() or m.has_existing_files()]
        self._load(live)  # (a manifest of removed entries only holds no live file)
        for manifest in live:
            statuses, _, paths = self._entries[manifest.manifest_path]
            out.update(p for status, p in zip(statuses, paths, strict=True) if status != 2)
        return out

    def removed_by(self, snapshot: Snapshot) -> list[str]:
        """The data and delete files `snapshot` removed (normalized), in the order of its
        manifests' entries (about the order they were written in: deleting files in that order
        is faster than in hash order, `expiry`): the entries it marked DELETED in the manifests
        it added. Each was live in its parent."""
        own = [
            m
            for m in self._manifests(snapshot) or []
            if m.added_snapshot_id == snapshot.snapshot_id
            and (m.deleted_files_count is None or m.deleted_files_count > 0)
        ]
        self._load(own)
        sid = snapshot.snapshot_id
        return [
            p
            for m in own
            for status, by, p in zip(*self._entries[m.manifest_path], strict=True)
            if status == 2 and by == sid
        ]

    def metadata_of(self, snapshots: Iterable[Snapshot]) -> tuple[set[str], list[ManifestFile]]:
        """The manifest lists, change files and manifests of `snapshots` (normalized), and those
        manifests."""
        out: set[str] = set()
        manifests: dict[str, ManifestFile] = {}
        snapshots = list(snapshots)
        self._load_lists(snapshots)
        for snapshot in snapshots:
            out.add(self._seen(snapshot.manifest_list))
            change = snapshot.summary.get(CHANGE_FILE) if snapshot.summary is not None else None
            if change:  # the snapshot's own change file (`commit.CHANGE_FILE`): its own
                out.add(self._seen(change))
            for manifest in self._manifests(snapshot) or []:
                manifests.setdefault(manifest.manifest_path, manifest)
        out.update(self._seen(path) for path in manifests)
        return out, list(manifests.values())

    def _load(self, manifests: list[ManifestFile]) -> None:
        todo = [m for m in manifests if m.manifest_path not in self._entries]
        if len(todo) > 1 and not all(m.manifest_path.startswith(_LOCAL) for m in todo):
            with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(todo))) as pool:
                read = list(pool.map(self._read, todo))  # object stores: fetch in parallel
        else:
            read = [self._read(m) for m in todo]  # decoding holds the GIL: threads gain nothing
        for manifest, entries in zip(todo, read, strict=True):
            self._entries[manifest.manifest_path] = entries

    def _load_lists(self, snapshots: list[Snapshot]) -> None:
        """Read the manifest lists of `snapshots` not read yet, in parallel on object stores
        (each is a request: 21 of them one after the other cost ~0.3 s on S3)."""
        todo = list({s.manifest_list: s for s in snapshots if s.manifest_list not in self._lists})
        if len(todo) > 1 and not all(path.startswith(_LOCAL) for path in todo):
            by_list = {s.manifest_list: s for s in snapshots}
            with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(todo))) as pool:
                list(pool.map(lambda path: self._manifests(by_list[path]), todo))

    def _manifests(self, snapshot: Snapshot) -> list[ManifestFile] | None:
        """The snapshot's manifest list (None: gone, a concurrent cleanup removed it)."""
        if snapshot.manifest_list not in self._lists:
            try:
                found: list[ManifestFile] | None = manifest_files(self.io, snapshot)
            except (OSError, ValueError):
                found = None
            self._lists[snapshot.manifest_list] = found
        return self._lists[snapshot.manifest_list]

    def _read(self, manifest: ManifestFile) -> EntryColumns:
        try:
            statuses, owners, paths = entry_columns(self.io, manifest)
        except (OSError, ValueError):
            return [], [], []
        seen = self._seen  # `file:///x` is `/x` without a call (`_local_path`; 20,000 a cleanup)
        keys = [p[7:] if p.startswith("file:///") else seen(p) for p in paths]
        return statuses, owners, keys

    def _seen(self, location: str) -> str:
        key = norm(location)
        if _local_path(location) is None:  # else deleted by `key` itself (`location`)
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
    local = _local_path(path)
    if local is not None:  # (urlparse costs ~7 µs a path: 20,000 paths in a cleanup)
        return local
    plain = _plain_uri(path)
    if plain is not None:
        return f"{plain[1]}{plain[2]}"
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return path.removeprefix("file://")
    return f"{parsed.netloc}{parsed.path}"


def _local_path(location: str) -> str | None:
    """The path of a plain local location (`/x` or `file:///x`) without parsing it (None: parse
    it)."""
    if location.startswith("/"):
        return location
    if location.startswith("file:///"):
        return location[7:]
    return None


def _plain_uri(location: str) -> tuple[str, str, str] | None:
    """(scheme, netloc, path) of a plain object-store URI (`s3://bucket/key`: no query,
    fragment or parameters) split without parsing it, as `urlparse` splits it (None: parse
    it)."""
    scheme, sep, rest = location.partition("://")
    if not sep or not scheme.isalnum() or scheme == "file" or any(c in rest for c in "?#;"):
        return None
    netloc, slash, path = rest.partition("/")
    return scheme.lower(), netloc, slash + path


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
    with paused():  # the live entries of every manifest decoded: no collection walks them
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
    """Delete the given orphan files (`delete_files`, per FileIO configuration); returns how many
    were removed. A file already gone is skipped; any other failure raises, after the rest."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for orphan in orphans:
        groups.setdefault(tuple(sorted(orphan.io_properties.items())), []).append(orphan.path)
    removed = 0
    failures: list[str] = []
    for props, paths in groups.items():
        done, failed = delete_files(paths, dict(props))
        removed += done
        failures.extend(failed)
    if failures:
        raise OSError(f"could not delete {len(failures)} orphan file(s): {failures[0]}")
    return removed


def delete_paths(io: FileIO, paths: Iterable[str]) -> int:
    """Delete files of the table whose FileIO is `io` (best effort: `delete_files`); returns how
    many were deleted."""
    return delete_files(paths, io.properties)[0]


DELETE_BATCH = 1000  # keys per S3 multi-object delete: the API's maximum
# Threads deleting local files: an unlink waits on the filesystem's journal and the directory's
# lock, not on the GIL (20,000 unlinks after a sync on a busy machine: 16 threads 0.8-1.8 s,
# 4 threads 2.7-4.8 s; benchmarks/results/small-files-maintenance.md).
LOCAL_DELETE_THREADS = 16
# Multi-object deletes in flight at once: each waits on the server, not on the GIL (20,000 keys
# on SeaweedFS in batches of 1,000: 4 at a time 4.6-4.8 s, 16 at a time 3.2 s;
# benchmarks/results/small-files-maintenance.md).
S3_DELETE_THREADS = 16
_S3 = ("s3", "s3a", "s3n")


def delete_files(locations: Iterable[str], properties: Mapping[str, str]) -> tuple[int, list[str]]:
    """Delete files given as the table references them (local paths, `file://` or object-store
    URIs), in parallel batches; (how many were deleted, one line per file that could not be —
    a file already gone is neither).

    Local files: `os.remove` in `LOCAL_DELETE_THREADS` threads, a batch of files per task, each
    batch handed to the threads as soon as it is made (a cleanup's first unlink does not wait
    for 20,000 locations to be sorted out). S3: one multi-object delete per `DELETE_BATCH` keys
    through boto3 (what pyiceberg's SigV4 signing already needs), configured from the FileIO's
    `s3.*` properties, `S3_DELETE_THREADS` requests at a time; without boto3, or when the request
    itself fails, one delete per key through the table's pyarrow filesystem. Other stores: one
    delete per file through the pyarrow filesystem, `READ_THREADS` at a time."""
    items = locations if isinstance(locations, list) else list(locations)
    size = _batch_size(len(items), LOCAL_DELETE_THREADS * 2)  # (as `_batches` on local files)
    deleter = _Deleter(properties)
    s3: dict[str, list[str]] = {}
    other: list[str] = []
    results: list[tuple[int, list[str]]] = []
    with ExitStack() as pools:
        local: ThreadPoolExecutor | None = None
        started: list[Future[tuple[int, list[str]]]] = []
        batch: list[str] = []
        for location in items:
            path = _local_path(location)
            if path is None:
                plain = _plain_uri(location)
                scheme, netloc, path = plain or urlparse(location)[:3]
                if scheme in _S3:
                    s3.setdefault(netloc, []).append(location)
                    continue
                if scheme not in ("", "file"):
                    other.append(location)
                    continue
                path = path if scheme else location
            batch.append(path)
            if len(batch) == size:
                if local is None:
                    local = pools.enter_context(ThreadPoolExecutor(LOCAL_DELETE_THREADS))
                started.append(local.submit(_remove_local, batch))
                batch = []
        if batch and local is None:
            results.append(_remove_local(batch))  # the only batch: no thread for it
        elif batch and local is not None:
            started.append(local.submit(_remove_local, batch))
        jobs = [
            keys[i : i + DELETE_BATCH]
            for keys in s3.values()
            for i in range(0, len(keys), DELETE_BATCH)
        ]
        if jobs:
            with ThreadPoolExecutor(max_workers=min(S3_DELETE_THREADS, len(jobs))) as pool:
                results += list(pool.map(deleter.s3_batch, jobs))
        results += [future.result() for future in started]
    if other:
        batches = _batches(other, READ_THREADS * 4)
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(batches))) as pool:
            results += list(pool.map(deleter.one_by_one, batches))
    return sum(n for n, _ in results), [line for _, lines in results for line in lines]


def _batches(items: list[str], parts: int) -> list[list[str]]:
    """`items` in about `parts` batches of at least 64 (`_batch_size`)."""
    size = _batch_size(len(items), parts)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _batch_size(count: int, parts: int) -> int:
    """The size of about `parts` batches of `count` items, at least 64 (a task per file costs
    more than its delete)."""
    return max(64, -(-count // parts))


def _delete_each(locations: list[str], delete: Callable[[str], object]) -> tuple[int, list[str]]:
    """`delete` each location: (how many went, what could not with why); a missing one is fine."""
    removed, failed = 0, []
    for location in locations:
        try:
            delete(location)
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed.append(f"{location}: {exc}")
    return removed, failed


def _remove_local(paths: list[str]) -> tuple[int, list[str]]:
    return _delete_each(paths, os.remove)


class _Deleter:
    """Deletes object-store files with one set of FileIO properties (clients made once)."""

    def __init__(self, properties: Mapping[str, str]) -> None:
        self.properties = dict(properties)
        self._client: Any = None
        self._lock = threading.Lock()

    def one_by_one(self, locations: list[str]) -> tuple[int, list[str]]:
        return _delete_each(locations, self._delete_one)

    def _delete_one(self, location: str) -> None:
        fs, path = filesystem(location, self.properties)
        fs.delete_file(path)

    def s3_batch(self, locations: list[str]) -> tuple[int, list[str]]:
        """One multi-object delete of `locations` (one bucket, at most `DELETE_BATCH` keys)."""
        client = self._s3_client()
        if client is None:
            return self.one_by_one(locations)
        parsed = [_plain_uri(location) or urlparse(location)[:3] for location in locations]
        bucket = parsed[0][1]
        try:
            answer = client.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": p[2].lstrip("/")} for p in parsed], "Quiet": True},
            )
        except Exception:  # the request itself failed (credentials, endpoint): key by key
            return self.one_by_one(locations)
        errors = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        failed = [f"s3://{bucket}/{e.get('Key')}: {e.get('Code')}" for e in errors]
        return len(locations) - len(answer.get("Errors", [])), failed

    def _s3_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = _boto3_s3_client(self.properties) or False
            return self._client or None


def _boto3_s3_client(props: Mapping[str, str]) -> Any:
    """A boto3 S3 client configured as pyiceberg configures its S3 FileIO (None: no boto3)."""
    try:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]
    except ImportError:
        return None
    endpoint = props.get("s3.endpoint")
    virtual = props.get("s3.force-virtual-addressing", "false").lower() == "true"
    style = "path" if endpoint and not virtual else "virtual" if virtual else "auto"
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=props.get("s3.access-key-id") or props.get("client.access-key-id"),
        aws_secret_access_key=props.get("s3.secret-access-key")
        or props.get("client.secret-access-key"),
        aws_session_token=props.get("s3.session-token") or props.get("client.session-token"),
        region_name=props.get("s3.region") or props.get("client.region"),
        config=Config(s3={"addressing_style": style}),
    )
