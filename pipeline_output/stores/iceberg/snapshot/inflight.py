"""Writes in flight versus orphan removal: the rule that no sweep deletes the files of a write
still running, and no write commits a snapshot whose files are gone.

A write's files exist before its commit references them — data files written ahead of the lock,
files rewritten under it, manifests and the manifest list, the new `metadata.json` — so until the
commit they look exactly like orphans, whatever their age. Three parts:

1. **Writers register** (`writing`): every writer of the project (writes, streaming replaces,
   compactions; audited writes to a branch too) holds the table's *files lock*
   (`locks.iceberg_files`) **shared** from before its first file until its commit is over. Writers
   share it, so they never wait for each other on it; its session is also the one the writer
   takes the table's writer lock on (one connection per write).
2. **Orphan removal quiesces** (`quiesced`): after listing the table's files (no lock: listing
   a big table takes long) it takes the files lock **alone** — without queueing, so writers never
   wait behind it, for at most `wait_s`, else `LockUnavailable` and nothing deleted — and then the
   writer lock (no commit of any kind is under way), re-reads the table and keeps only what is
   still unreferenced. No write of the project is then between "files written" and "committed",
   and any later write only writes new files or references files the table already references,
   so what is left is deleted after both locks are released.
3. **Commits verify** (`verify_written`): right before the catalog swap, the commit checks that
   every file it wrote or is about to reference anew (data and delete files, new manifests, the
   manifest list) still exists, else `FilesRemoved`: nothing committed. This covers writers the
   lock does not: `lock=None`, and a writer whose lock session ended (it fails with `LockLost`
   first anyway).

A commit's new `metadata.json` (written by the catalog just before its swap) is never an orphan
while its version is above the table's current one (`orphans.table_orphans`): that also covers a
committer outside the project. Other files of writers outside the project's locks (other engines)
are protected by the grace period only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from pyiceberg.io import FileIO
from pyiceberg.table.update.snapshot import _SnapshotProducer

from pipeline_output.errors import FilesRemoved, LockUnavailable
from pipeline_output.infra.locks import AdvisoryLock, HeldLock, iceberg_files, iceberg_table
from pipeline_output.stores.iceberg.table.properties import READ_THREADS

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables

DEFAULT_WAIT_S = 300.0  # how long orphan removal waits for the writes in flight to end


def writing(store: HasTables, table: str) -> AbstractContextManager[HeldLock | None]:
    """Register a write of `table` (`namespace.name`) from before its first file until its commit
    ended: the files lock held shared. Pass the held lock to `store.tables.hold(..., on=)`. A store
    without an advisory lock registers nothing."""
    lock = store.tables.advisory()
    if not isinstance(lock, AdvisoryLock):
        return nullcontext(None)
    return lock.share(iceberg_files(table))


@contextmanager
def quiesced(store: HasTables, table: str, *, dataset: str, wait_s: float) -> Iterator[float]:
    """No write of `table` between its files and its commit, and no commit, for the block: the
    files lock alone (waiting at most `wait_s` for the writes in flight), then the writer lock.
    Yields the seconds waited. A store without an advisory lock quiesces nothing."""
    lock = store.tables.advisory()
    if not isinstance(lock, AdvisoryLock):
        yield 0.0
        return
    with ExitStack() as stack:
        try:
            held = stack.enter_context(lock.alone(iceberg_files(table), wait_s=wait_s))
        except LockUnavailable as exc:
            raise LockUnavailable(
                f"dataset {dataset!r}: writes of {table} were still in progress after "
                f"{wait_s:g}s; no orphan was removed — run it again"
            ) from exc
        stats = stack.enter_context(lock.hold(iceberg_table(table), on=held))
        yield held.wait_s + stats.wait_s


def verify_written(
    io: FileIO, producer: _SnapshotProducer[Any], written: Iterable[str], *, dataset: str
) -> None:
    """`FilesRemoved` unless every path in `written` and the manifests and manifest list the
    snapshot `producer` staged wrote still exist (checked right before the catalog swap)."""
    paths = [*written, *producer._written_manifests, *producer._written_manifest_lists]
    missing = _missing(io, paths)
    if missing:
        raise FilesRemoved(
            f"dataset {dataset!r}: {len(missing)} file(s) this write had written were deleted "
            f"before its commit (e.g. {missing[0]}; an orphan removal while the write held no "
            "lock?); nothing was committed — run it again"
        )


def _missing(io: FileIO, paths: list[str]) -> list[str]:
    def gone(path: str) -> bool:
        try:
            return not io.new_input(path).exists()
        except (OSError, ValueError):
            return True

    if len(paths) <= 4:
        return [p for p in paths if gone(p)]
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(paths))) as pool:
        return [p for p, g in zip(paths, pool.map(gone, paths), strict=True) if g]
