"""Snapshot expiry and orphan removal on real parts: expired snapshots' files are deleted (pyiceberg
deletes none), every remaining snapshot still reads what it read before, nothing under the table
location is left unreferenced except files younger than the grace period, and re-runs change
nothing. Window repair across expiry is in `pipeline_output_tests/services/test_maintenance_windows.py`.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec
from pipeline_output.errors import ChangesUnsupported, InvalidArgument, SnapshotExpired
from pipeline_output.stores.iceberg.maintenance.orphans import norm, referenced
from pipeline_output.stores.iceberg.snapshot.commit import CHANGE_FILE
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
from pipeline_output.stores.iceberg.table.changes import read_changes
from pipeline_output_tests.iceberg_harness import Harness
from pipeline_output_tests.oracle import assert_same_multiset

SPEC = DatasetSpec(name="accounts", primary_key=("id",), strategy="snapshot_replace")


def frame(ids: range | list[int], version: int) -> pl.DataFrame:
    ids = list(ids)
    return pl.DataFrame({"id": pl.Series(ids, dtype=pl.Int64), "v": [version] * len(ids)})


def history(h: Harness) -> dict[int, pl.DataFrame]:
    """Upserts that rewrite files (new keys and updated keys), then a compaction: snapshot id ->
    what that snapshot reads, recorded before anything expires."""
    for n in range(8):
        h.store().write(SPEC, frame(range(n * 10, n * 10 + 15), n))  # 5 keys updated per write
        h.store().write(SPEC, frame(range(1000 + n * 10, 1000 + n * 10 + 10), n))  # new file
    h.store().compact(SPEC, min_input_files=2)
    table = h.table(SPEC)
    return {
        s.snapshot_id: pl.from_arrow(table.scan(snapshot_id=s.snapshot_id).to_arrow())
        for s in table.snapshots()
    }


def files_under(table: Any) -> list[str]:
    root = Path(table.location().removeprefix("file://"))
    return [str(p) for p in root.rglob("*") if p.is_file()]


def unreferenced(table: Any) -> list[str]:
    known = referenced(table)
    return [p for p in files_under(table) if norm(p) not in known]


def test_expiry_deletes_what_only_expired_snapshots_referenced_and_the_rest_still_reads(
    h: Harness,
):
    reads = history(h)
    table = h.table(SPEC)
    snaps = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    keep_from = snaps[-5]  # expire everything older than the fifth newest snapshot
    cutoff = datetime.fromtimestamp(keep_from.timestamp_ms / 1000, tz=UTC)
    files_before = len(files_under(table))

    result = h.store().expire_snapshots(SPEC, older_than=cutoff, retain_last=1, ledger=None)

    table = h.table(SPEC)
    remaining = [s.snapshot_id for s in table.snapshots()]
    assert sorted(remaining) == sorted(s.snapshot_id for s in snaps[-5:])
    assert result.snapshots_expired == len(snaps) - 5 and result.files_deleted > 0
    assert len(files_under(table)) < files_before
    for snapshot_id in remaining:  # every remaining snapshot still reads, the same rows
        got = pl.from_arrow(table.scan(snapshot_id=snapshot_id).to_arrow())
        assert_same_multiset(got, reads[snapshot_id])
    assert unreferenced(table) == []  # nothing under the location is left unreferenced
    assert table.properties["pipeline-output.last-expiry"].endswith(
        f"expired {result.snapshots_expired} snapshot(s)"
    )

    again = h.store().expire_snapshots(SPEC, older_than=cutoff, ledger=None)  # re-run: no-op
    assert (again.snapshots_expired, again.files_deleted) == (0, 0)
    assert sorted(s.snapshot_id for s in h.table(SPEC).snapshots()) == sorted(remaining)


def test_expire_everything_but_the_last_keeps_the_current_table_whole(h: Harness):
    reads = history(h)
    current = h.table(SPEC).current_snapshot().snapshot_id
    dry = h.store().expire_snapshots(SPEC, older_than=timedelta(0), ledger=None, dry_run=True)
    assert dry.dry_run and dry.snapshots_expired == len(reads) - 1
    assert len(h.table(SPEC).snapshots()) == len(reads)  # the dry run changed nothing

    result = h.store().expire_snapshots(SPEC, older_than=timedelta(0), ledger=None)

    assert result.files_deleted == dry.files_deleted
    table = h.table(SPEC)
    assert [s.snapshot_id for s in table.snapshots()] == [current]
    assert_same_multiset(h.contents(SPEC), reads[current])
    assert unreferenced(table) == []
    assert len(list(table.scan().plan_files())) == 1  # the compacted file only


def test_expiry_keeps_young_snapshots_and_refuses_retaining_none(h: Harness):
    reads = history(h)
    result = h.store().expire_snapshots(SPEC, ledger=None)  # default: older than 5 days
    assert result.snapshots_expired == 0
    assert len(h.table(SPEC).snapshots()) == len(reads)
    with pytest.raises(InvalidArgument, match="retain_last"):
        h.store().expire_snapshots(SPEC, retain_last=0, ledger=None)


def _orphan_data_file(h: Harness) -> list[str]:
    """What a writer killed between writing its data file and its commit leaves behind."""
    table = h.table(SPEC)
    writer = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4())
    writer.write(frame([999_999], 0))
    return [p.removeprefix("file://") for p in writer.written]


def _age(paths: list[str], seconds: float) -> None:
    past = time.time() - seconds
    for path in paths:
        os.utime(path, (past, past))


def test_orphan_removal_deletes_old_unreferenced_files_and_never_young_ones(h: Harness):
    history(h)
    h.store().expire_snapshots(SPEC, older_than=timedelta(0), ledger=None)
    old, young = _orphan_data_file(h), _orphan_data_file(h)
    meta_dir = Path(h.table(SPEC).location().removeprefix("file://")) / "metadata"
    stray = meta_dir / f"{uuid.uuid4()}-m0.avro"  # a manifest of a commit that never landed
    stray.write_bytes(b"not referenced")
    _age([*old, str(stray)], 7200)

    found = h.store().remove_orphans(SPEC, dry_run=True)  # default grace: one hour
    assert (found.files, found.dry_run) == (2, True)
    assert all(Path(p).exists() for p in [*old, str(stray)])

    removed = h.store().remove_orphans(SPEC)

    assert removed.files == 2
    assert not any(Path(p).exists() for p in [*old, str(stray)])
    assert all(Path(p).exists() for p in young)  # younger than the grace period: kept
    table = h.table(SPEC)
    assert sorted(unreferenced(table)) == sorted(young)
    assert h.store().remove_orphans(SPEC).files == 0  # re-run: nothing more
    assert h.store().remove_orphans(SPEC, grace_s=0).files == 1
    assert unreferenced(h.table(SPEC)) == []
    assert h.contents(SPEC) is not None  # every referenced file is still there


# -- time travel across expiry (issue 30, item 1) -------------------------------------------------


def _versions(h: Harness, n: int) -> list[tuple[int, datetime, pl.DataFrame]]:
    """`n` writes to main, each with a time strictly inside its stay as main and its rows."""
    out = []
    for i in range(n):
        snapshot = h.store().write(SPEC, frame(range(i * 3, i * 3 + 4), i)).snapshot_id
        time.sleep(0.01)
        out.append((snapshot, datetime.now(UTC), h.contents(SPEC)))
        time.sleep(0.01)
    return out


def test_expiry_of_mains_oldest_versions_makes_their_times_unanswerable_and_records_why(
    h: Harness,
):
    (s1, at1, _), (s2, at2, rows2), (_, at3, rows3) = _versions(h, 3)
    store = h.store()
    h.table(SPEC).manage_snapshots().create_tag(s2, "other-tool").commit()  # kept, like S3
    store.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1, ledger=None)

    table = h.table(SPEC)
    assert table.snapshot_by_id(s1) is None
    earliest = table.properties["pipeline-output.time-travel-from"]
    s2_since = next(e.timestamp_ms for e in table.metadata.snapshot_log if e.snapshot_id == s2)
    assert datetime.fromisoformat(earliest).timestamp() * 1000 == s2_since
    with pytest.raises(SnapshotExpired, match=f"dataset 'accounts'.*{re.escape(earliest)}"):
        store.read(SPEC, as_of=at1)
    assert_same_multiset(store.read(SPEC, as_of=at2), rows2)  # S2's time follows the gap
    assert_same_multiset(store.read(SPEC, as_of=at3), rows3)
    with pytest.raises(SnapshotExpired, match="earliest time"):  # long before: refused too
        store.read(SPEC, as_of=at1.replace(year=2000))


def test_as_of_after_another_tools_expiry_is_refused_from_the_snapshot_log_alone(h: Harness):
    """pyiceberg's own `expire_snapshots` records no boundary: the log shows the gap (S3 was
    committed onto S2, whose entry is gone; before: S1's rows at S2's time)."""
    (s1, at1, rows1), (s2, at2, _), (_, at3, rows3) = _versions(h, 3)
    table = h.table(SPEC)
    table.manage_snapshots().create_tag(s1, "other-tool").commit()
    table.maintenance.expire_snapshots().by_id(s2).commit()

    assert "pipeline-output.time-travel-from" not in h.table(SPEC).properties
    for moment in (at2, at1):
        with pytest.raises(SnapshotExpired, match=r"dataset 'accounts'.*earliest time"):
            h.store().read(SPEC, as_of=moment)
    assert_same_multiset(h.store().read(SPEC, as_of=at3), rows3)
    assert_same_multiset(h.store().read(SPEC, as_of=s1), rows1)


def test_main_moving_back_to_a_snapshot_shows_the_gap_an_expiry_left(h: Harness):
    """S1, S2, main back to S1 (another tool), S3 onto S1, then S2 expired by another tool: two
    entries of S1 in a row; a time when main pointed at S2 is refused (before: S1's rows)."""
    from pipeline_output.stores.iceberg.table.tables import head, move_main

    (s1, _, _), (s2, at2, _) = _versions(h, 2)
    move_main(h.table(SPEC), s1, expected=s2)
    time.sleep(0.01)
    at_back = datetime.now(UTC)
    back_rows = h.contents(SPEC)
    ((_, at3, rows3),) = _versions(h, 1)
    h.table(SPEC).maintenance.expire_snapshots().by_id(s2).commit()

    with pytest.raises(SnapshotExpired, match="dataset 'accounts'"):
        h.store().read(SPEC, as_of=at2)
    assert_same_multiset(h.store().read(SPEC, as_of=at_back), back_rows)
    assert_same_multiset(h.store().read(SPEC, as_of=at3), rows3)
    assert head(h.table(SPEC)) is not None


def test_without_expiry_every_time_since_the_first_snapshot_answers_after_moves_of_main(
    h: Harness,
):
    """No false refusal: rollbacks and re-commits leave no gap while nothing expired."""
    from pipeline_output.stores.iceberg.table.tables import move_main

    (s1, at1, rows1), (s2, at2, rows2) = _versions(h, 2)
    move_main(h.table(SPEC), s1, expected=s2)
    ((_, at3, rows3),) = _versions(h, 1)
    for moment, rows in ((at1, rows1), (at2, rows2), (at3, rows3)):
        assert_same_multiset(h.store().read(SPEC, as_of=moment), rows)


def test_local_deletes_run_in_batches_count_what_went_and_report_what_could_not(tmp_path: Path):
    from pipeline_output.stores.iceberg.maintenance.orphans import delete_files

    files = [tmp_path / f"f{i}.parquet" for i in range(700)]
    for f in files:
        f.write_bytes(b"x")
    undeletable = tmp_path / "a-directory"
    undeletable.mkdir()
    locations = [f"file://{f}" if i % 2 else str(f) for i, f in enumerate(files)]

    deleted, failed = delete_files(
        [*locations, str(tmp_path / "already-gone.parquet"), str(undeletable)], {}
    )

    assert deleted == 700 and not any(f.exists() for f in files)
    assert len(failed) == 1 and failed[0].startswith(str(undeletable))


def test_expired_files_found_from_removals_are_the_ones_full_reachability_finds(h: Harness):
    """Expiry reads the tips' live entries and what each child of an expired snapshot removed,
    not every expired snapshot's entries: the same files, whichever snapshots expire."""
    from pipeline_output.stores.iceberg.maintenance.expiry import expired_files
    from pipeline_output.stores.iceberg.maintenance.orphans import ManifestReader

    history(h)
    table = h.table(SPEC)
    snaps = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    cases = [snaps[:k] for k in range(1, len(snaps))] + [snaps[2:9], snaps[5:-1], snaps[::2]]
    data_files_doomed = 0
    for expired in cases:
        gone = {s.snapshot_id for s in expired}
        reader = ManifestReader(table.io)
        kept = reader.files_of(s for s in snaps if s.snapshot_id not in gone)
        full = reader.files_of(expired) - kept
        data_files_doomed += sum(p.endswith(".parquet") for p in full)
        found = expired_files(ManifestReader(table.io), snaps, gone)
        assert set(found) - kept == full and len(found) == len(set(found))
    assert data_files_doomed > 0


def _compacted_121_files(h: Harness) -> list[Path]:
    """121 one-row files (120 committed at once), compacted into one: the compaction's manifest
    removes 121 entries in blocks of many. The table's files before the compaction."""
    from pipeline_output.stores.iceberg.snapshot.commit import CommitRequest, commit
    from pipeline_output.stores.iceberg.snapshot.manifests import FlatTransaction

    h.store().write(SPEC, frame([0], 0))
    table = h.table(SPEC)
    tx = FlatTransaction(table)
    writer = DataFileWriter(tx.table_metadata, table.io, write_id=uuid.uuid4())
    ready = [f for i in range(1, 121) for f in writer.write(frame([i], 0))]
    commit(CommitRequest(tx=tx, dataset=SPEC.name, properties={}, ready=ready, blind_retry=True))
    before = files_under(h.table(SPEC))
    h.store().compact(SPEC, min_input_files=2)
    return before


def _removed_entries_decoded(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[Any]]:
    """The paths the current snapshot's manifests remove, each manifest's native decode checked
    against pyiceberg's decoder entry for entry; and every native decode made meanwhile."""
    from pipeline_output.stores.iceberg.table import manifest_decoding

    table = h.table(SPEC)
    native: list[Any] = []
    decode = manifest_decoding._native_paths

    def spy(data: bytes, names: Any, *rest: Any) -> Any:
        native.append(decode(data, names, *rest))
        return native[-1]

    monkeypatch.setattr(manifest_decoding, "_native_paths", spy)
    removed = []
    for manifest in table.current_snapshot().manifests(table.io):
        entries = manifest.fetch_manifest_entry(table.io, discard_deleted=False)
        expected = [(int(e.status), e.snapshot_id, e.data_file.file_path) for e in entries]
        assert manifest_decoding.entry_paths(table.io, manifest) == expected
        removed += [path for status, _, path in expected if status == 2]
    return removed, native


def test_a_compactions_removed_entries_are_decoded_natively_path_for_path(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The manifest of a compaction's removed entries (blocks of many entries) is decoded by
    polars' native Avro reader, not entry by entry: the same (status, snapshot, path) as
    pyiceberg's decoder, and expiry deletes exactly those files."""
    from pipeline_output.stores.iceberg.maintenance import orphans

    before = _compacted_121_files(h)
    removed, native = _removed_entries_decoded(h, monkeypatch)
    assert len(removed) == 121 and len(native) == 1 and native[0] is not None

    monkeypatch.setattr(orphans, "LOCAL_DELETE_THREADS", 3)  # more batches than threads
    h.store().expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    left = files_under(h.table(SPEC))
    assert {norm(p) for p in removed} <= {norm(p) for p in before} - {norm(p) for p in left}
    assert_same_multiset(h.store().read(SPEC.name), frame(range(121), 0))


def test_a_manifest_of_many_big_blocks_is_decoded_in_two_halves_entry_for_entry(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """A manifest of `PARALLEL_BLOCKS` blocks or more is decoded natively as two halves at
    once: the same (status, snapshot, path) in the same order as pyiceberg's decoder."""
    from pipeline_output.stores.iceberg.table import manifest_decoding, manifest_encoding

    monkeypatch.setattr(manifest_encoding, "BLOCK_ENTRIES", 20)  # the removed entries: 7 blocks
    monkeypatch.setattr(manifest_decoding, "NATIVE_BLOCK", 10)
    _compacted_121_files(h)
    removed, decoded = _removed_entries_decoded(h, monkeypatch)
    assert len(removed) == 121
    assert len(decoded) == 2 and all(d is not None and 0 < len(d[2]) < 121 for d in decoded)


def test_expiry_decodes_the_removed_entries_paths_without_their_statistics(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The native decode of a compaction's removed entries asks polars for the status, snapshot
    id and path columns only — the data file's fields read as columns of their own, its
    statistics skipped undecoded, never the data file's struct — and gives the same (status,
    snapshot, path) as pyiceberg's decoder; expiry then deletes those files."""
    import polars as pl

    from pipeline_output.stores.iceberg.table import manifest_decoding

    asked: list[Any] = []
    read_avro = pl.read_avro

    def spy(source: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("columns"))
        return read_avro(source, *args, **kwargs)

    before = _compacted_121_files(h)
    monkeypatch.setattr(manifest_decoding.pl, "read_avro", spy)
    removed, native = _removed_entries_decoded(h, monkeypatch)
    assert len(removed) == 121 and len(native) == 1 and native[0] is not None
    assert asked == [["status", "snapshot_id", "file_path"]]

    h.store().expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    left = files_under(h.table(SPEC))
    assert {norm(p) for p in removed} <= {norm(p) for p in before} - {norm(p) for p in left}
    assert all(columns is None or "data_file" not in columns for columns in asked)
    assert_same_multiset(h.store().read(SPEC.name), frame(range(121), 0))


def test_expiry_reads_the_removed_entries_before_its_locks_once_and_deletes_the_same_files(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The compaction's removed entries are read from the start of the expiry, before it takes
    its locks (the writer lock here waits until they are read: it would wait in vain if only
    the plan, made under the locks, started the reads), decoded once, and expiry deletes the
    same files as ever: the files only the expired snapshots referenced."""
    import threading

    from pipeline_output.stores.iceberg.maintenance import orphans

    before = _compacted_121_files(h)
    removed, _ = _removed_entries_decoded(h, monkeypatch)
    table = h.table(SPEC)
    compaction = table.current_snapshot()
    big = {m.manifest_path for m in compaction.manifests(table.io) if m.deleted_files_count}
    decoded: list[str] = []
    read = threading.Event()
    entry_columns = orphans.entry_columns

    def spy(io: Any, manifest: Any) -> Any:
        out = entry_columns(io, manifest)
        if manifest.manifest_path in big:
            decoded.append(manifest.manifest_path)
            read.set()
        return out

    monkeypatch.setattr(orphans, "entry_columns", spy)
    store = h.store()
    waited = _hold_after(store, read, monkeypatch)
    result = store.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    assert waited == [True] and sorted(decoded) == sorted(big)
    left = {norm(p) for p in files_under(h.table(SPEC))}
    assert {norm(p) for p in removed} <= {norm(p) for p in before} - left
    assert result.files_deleted == len({norm(p) for p in before} - left)
    assert unreferenced(h.table(SPEC)) == []
    assert_same_multiset(h.store().read(SPEC.name), frame(range(121), 0))


def _hold_after(store: Any, event: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Make `store`'s writer lock wait (up to 20 s) for `event` before it is taken; the list
    records, per lock taken, whether the event was set by then."""
    hold = store.tables.hold
    waited: list[bool] = []

    def hold_after(spec: DatasetSpec, **kwargs: Any) -> Any:
        waited.append(event.wait(timeout=20))
        return hold(spec, **kwargs)

    monkeypatch.setattr(store.tables, "hold", hold_after)
    return waited


def test_expiry_reads_the_expired_snapshots_own_manifest_lists_before_its_locks(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The expired snapshots' own manifest lists (decoded by fastavro, holding the GIL) are read
    from the start of the expiry, beside its locks and ledger queries, not while it commits: the
    writer lock here waits until every one of them was read (it would wait in vain if only the
    plan, made under the locks, read the lists of the snapshots that have no child left); the
    same files are deleted as ever."""
    import threading

    from pipeline_output.stores.iceberg.maintenance import orphans

    before = _compacted_121_files(h)
    table = h.table(SPEC)
    current = table.current_snapshot().snapshot_id
    lists = {s.manifest_list for s in table.snapshots() if s.snapshot_id != current}
    assert len(lists) == 2
    read: set[str] = set()
    all_read = threading.Event()
    manifest_files = orphans.manifest_files

    def spy(io: Any, snapshot: Any) -> Any:
        out = manifest_files(io, snapshot)
        read.add(snapshot.manifest_list)
        if lists <= read:
            all_read.set()
        return out

    monkeypatch.setattr(orphans, "manifest_files", spy)
    store = h.store()
    waited = _hold_after(store, all_read, monkeypatch)
    result = store.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    assert waited == [True]
    left = {norm(p) for p in files_under(h.table(SPEC))}
    assert {norm(p) for p in lists}.isdisjoint(left)
    assert result.files_deleted == len({norm(p) for p in before} - left)
    assert unreferenced(h.table(SPEC)) == []
    assert_same_multiset(h.store().read(SPEC.name), frame(range(121), 0))


def test_local_deletes_start_while_later_locations_are_still_being_sorted_out(tmp_path: Path):
    """The first batches of local files are deleted while the later locations are still being
    handed over (a cleanup's first unlink waits for no other file's location): halfway through
    the locations, files already went; every file goes, counted once."""
    import threading

    from pipeline_output.stores.iceberg.maintenance.orphans import delete_files

    files = [tmp_path / f"f{i}.parquet" for i in range(2000)]
    for f in files:
        f.write_bytes(b"x")
    went_meanwhile: list[bool] = []

    class Handed(list[str]):
        """The locations, checking halfway through them whether any file went already."""

        def __iter__(self) -> Any:
            for i, location in enumerate(list.__iter__(self)):
                if i == len(self) // 2:
                    gone = threading.Event()
                    for _ in range(400):  # up to 20 s
                        if any(not f.exists() for f in files[: len(self) // 2]):
                            gone.set()
                            break
                        time.sleep(0.05)
                    went_meanwhile.append(gone.is_set())
                yield location

    deleted, failed = delete_files(Handed(f"file://{f}" for f in files), {})

    assert went_meanwhile == [True]
    assert deleted == 2000 and failed == [] and not any(f.exists() for f in files)


def test_manifest_reader_keeps_no_location_for_local_files_and_deletes_them_by_their_path(
    h: Harness,
):
    """Local files (`file:///x`, `/x`) are keyed by their path and deleted by it: the reader keeps
    no location beside it for them (20,000 of them in a cleanup); the path is the file."""
    from pipeline_output.stores.iceberg.maintenance.orphans import ManifestReader

    history(h)
    table = h.table(SPEC)
    reader = ManifestReader(table.io)
    files = reader.files_of(table.snapshots())
    assert len(files) > 20 and reader.locations == {}
    assert all(reader.location(p) == p and Path(p).is_file() for p in files)


def test_expirys_ledger_reads_open_no_connection_and_no_transaction(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """What expiry asks the ledger under its locks — the downstreams' positions, the runs reading
    changes now, the windows not applied — is one statement each on a session of the process's
    pool: no connection opened when one is idle, no BEGIN and COMMIT around them."""
    import psycopg

    from pipeline_output.infra import pgsession
    from pipeline_output.ledger.control_plane import Ledger
    from pipeline_output.ledger.window_ledger import WindowLedger
    from pipeline_output.stores.iceberg.maintenance.expiry import consumer_positions

    Ledger(h.pg_db_url).migrate()
    h.store().write(SPEC, frame([1, 2], 0))
    with pgsession.pooled(h.pg_db_url):
        pass  # one idle session in the pool
    opened: list[str] = []
    transactions: list[object] = []
    connect, transaction = pgsession.connect, psycopg.Connection.transaction

    def counted_connect(url: str, **kwargs: Any) -> Any:
        opened.append(url)
        return connect(url, **kwargs)

    def counted_transaction(self: Any, *args: Any, **kwargs: Any) -> Any:
        transactions.append(self)
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(pgsession, "connect", counted_connect)
    monkeypatch.setattr(psycopg.Connection, "transaction", counted_transaction)
    assert consumer_positions(h.store(), SPEC) == set()
    assert WindowLedger(h.pg_db_url).unapplied_ids(SPEC.name) == set()
    assert opened == [] and transactions == []


# -- the change files of the change feed (`commit.CHANGE_FILE`) ---------------------------------


def _change_files(table: Any) -> dict[int, str]:
    """Snapshot id -> the local path of its change file, for the snapshots that carry one."""
    out = {}
    for s in table.snapshots():
        path = s.summary.get(CHANGE_FILE) if s.summary is not None else None
        if path:
            out[s.snapshot_id] = path.removeprefix("file://")
    return out


def test_change_files_are_referenced_by_their_snapshot_and_expire_with_it(h: Harness):
    h = replace(h, change_consumers=lambda dataset: True)  # a downstream consumes its changes
    history(h)
    table = h.table(SPEC)
    changes = _change_files(table)
    assert len(changes) >= 8 and all(Path(p).exists() for p in changes.values())
    assert all("/data/changes/" in p for p in changes.values())  # under the data location

    assert h.store().remove_orphans(SPEC, grace_s=0).files == 0  # live snapshots' change files
    assert all(Path(p).exists() for p in changes.values())

    snaps = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    keep_from = snaps[-5]
    cutoff = datetime.fromtimestamp(keep_from.timestamp_ms / 1000, tz=UTC)
    h.store().expire_snapshots(SPEC, older_than=cutoff, retain_last=1, ledger=None)

    kept = {s.snapshot_id for s in h.table(SPEC).snapshots()}
    for snapshot_id, path in changes.items():  # the expired snapshots' change files are gone
        assert Path(path).exists() == (snapshot_id in kept), (snapshot_id, path)
    assert unreferenced(h.table(SPEC)) == []
    first, last = snaps[-5].snapshot_id, snaps[-1].snapshot_id
    table = h.table(SPEC)  # the remaining range still composes from its change files
    composed = read_changes(table, from_snapshot=first, primary_key=["id"], composed=True)
    diffed = read_changes(table, from_snapshot=first, primary_key=["id"], composed=False)
    assert composed.to_snapshot == last
    assert_same_multiset(composed.frame, diffed.frame)


def test_an_unreferenced_change_file_is_an_orphan_and_a_missing_one_falls_back_to_the_diff(
    h: Harness,
):
    h = replace(h, change_consumers=lambda dataset: True)  # a downstream consumes its changes
    h.store().write(SPEC, frame(range(0, 10), 0))
    s1 = h.table(SPEC).current_snapshot().snapshot_id
    h.store().write(SPEC, frame(range(5, 15), 1))
    table = h.table(SPEC)
    (path,) = _change_files(table).values()
    stray = Path(path).with_name(f"{uuid.uuid4()}.parquet")  # a commit that never landed
    stray.write_bytes(Path(path).read_bytes())
    _age([str(stray)], 7200)
    assert h.store().remove_orphans(SPEC).files == 1
    assert not stray.exists() and Path(path).exists()

    expected = read_changes(table, from_snapshot=s1, primary_key=["id"], composed=True)
    assert expected.counts["update_after"] == 5 and expected.counts["insert"] == 5
    Path(path).unlink()  # lost: the change feed diffs the manifests instead
    got = read_changes(table, from_snapshot=s1, primary_key=["id"])
    assert_same_multiset(got.frame, expected.frame)
    with pytest.raises(ChangesUnsupported):
        read_changes(table, from_snapshot=s1, primary_key=["id"], composed=True)
