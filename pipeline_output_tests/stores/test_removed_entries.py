"""The entries of removed files (status DELETED) are written without their column metrics.

A commit that removes data files (a compaction's `replace`, a copy-on-write upsert's
overwrite) writes each removed file's entry DELETED with its content, path, format, partition, record
count, size, split offsets, sort order (and key metadata, equality ids) as they were, and its
six metric maps (column sizes, value/null/NaN counts, lower/upper bounds) empty: the spec makes
them optional, and only expiry, orphan removal and `inspect.entries` read DELETED entries. The
tables still read the same at every snapshot (this project, pyiceberg from a fresh handle with
time travel, DuckDB's iceberg extension), the change feed between any two snapshots reports the
same rows, and expiry deletes exactly the files only the expired snapshots referenced.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.snapshots import Snapshot

from pipeline_output import DatasetSpec
from pipeline_output.stores.iceberg.maintenance.orphans import norm, referenced
from pipeline_output.stores.iceberg.table.changes import (
    DELETE,
    INSERT,
    UPDATE_AFTER,
    UPDATE_BEFORE,
    read_changes,
)
from pipeline_output_tests.iceberg_harness import (
    DATA_FILE_FIELDS,
    METRIC_FIELDS,
    Harness,
    duckdb_with_iceberg,
)
from pipeline_output_tests.oracle import assert_same_multiset

# what a removed file's entry keeps as it was live: every field but its metrics
KEPT = (*(f for f in DATA_FILE_FIELDS if f not in METRIC_FIELDS), "partition")
CHANGE_KINDS = (INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER)
LAYOUTS = {"unpartitioned": (), "region": ("region",), "bucket": ("bucket(4, id)",)}


def frame(ids: range | list[int], version: int) -> pl.DataFrame:
    ids = list(ids)
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "v": pl.Series([version] * len(ids), dtype=pl.Int64),
            "region": [f"r{i % 3}" for i in ids],
            "amount": pl.Series([i * 0.5 + version for i in ids], dtype=pl.Float64),
        }
    )


def _spec(layout: str) -> DatasetSpec:
    return DatasetSpec(
        name=f"removed_{layout}",
        primary_key=("id",),
        strategy="snapshot_replace",
        write_strategy_hint="copy-on-write",
        partition_by=LAYOUTS[layout],
    )


def _history(h: Harness, spec: DatasetSpec) -> dict[int, pl.DataFrame]:
    """Copy-on-write upserts (each rewrites the files of the keys it updates) and new files,
    then a compaction: snapshot id -> its rows, as this project read them when it was current."""
    reads: dict[int, pl.DataFrame] = {}

    def record() -> None:
        reads[h.table(spec).current_snapshot().snapshot_id] = h.store().read(spec.name)

    for n in range(4):
        h.store().write(spec, frame(range(n * 10, n * 10 + 15), n))  # 5 keys updated per write
        record()
        h.store().write(spec, frame(range(1000 + n * 10, 1000 + n * 10 + 10), n))  # new file
        record()
    h.store().compact(spec, min_input_files=2)
    record()
    return reads


def _live_files(table: Any, snapshot_id: int) -> dict[str, DataFile]:
    snapshot = table.snapshot_by_id(snapshot_id)
    return {
        e.data_file.file_path: e.data_file
        for m in snapshot.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def _files_under(table: Any) -> set[str]:
    root = Path(table.location().removeprefix("file://"))
    return {norm(str(p)) for p in root.rglob("*") if p.is_file()}


def _written_entries(
    table: Any, snapshots: list[Snapshot]
) -> Iterator[tuple[Snapshot, ManifestEntry, DataFile | None]]:
    """Every entry of the manifests each snapshot after the first wrote, with its file as it was
    live in the parent when the entry removes it (None: a live entry)."""
    for snapshot in snapshots[1:]:
        before = _live_files(table, snapshot.parent_snapshot_id)
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                removed = entry.status == ManifestEntryStatus.DELETED
                yield snapshot, entry, before[entry.data_file.file_path] if removed else None


def _assert_unmeasured_copy(entry: ManifestEntry, was: DataFile) -> None:
    """A removed file's entry: no metrics (empty), every other field as it was live."""
    assert all(not getattr(entry.data_file, m) for m in METRIC_FIELDS), entry
    assert was.lower_bounds and was.value_counts  # it had them while live
    for name in KEPT:
        assert getattr(entry.data_file, name) == getattr(was, name), name


def _assert_reads_at_every_snapshot(
    table: Any, snapshots: list[Snapshot], reads: dict[int, pl.DataFrame]
) -> None:
    """pyiceberg's scan, time travelling to each snapshot, reads what was written there."""
    for snapshot in snapshots:
        scanned = pl.from_arrow(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow())
        assert isinstance(scanned, pl.DataFrame)
        assert_same_multiset(scanned, reads[snapshot.snapshot_id])


def _changes_expected(old: pl.DataFrame, new: pl.DataFrame) -> dict[str, set[int]]:
    """The keys inserted, deleted and updated from `old` to `new` (the oracle's diff)."""
    before = dict(zip(old["id"].to_list(), old.rows(), strict=True))
    after = dict(zip(new["id"].to_list(), new.rows(), strict=True))
    return {
        INSERT: set(after) - set(before),
        DELETE: set(before) - set(after),
        UPDATE_AFTER: {k for k in set(before) & set(after) if before[k] != after[k]},
    }


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_removed_files_entries_carry_no_metrics_and_every_reader_and_expiry_still_agree(
    h: Harness, layout: str
):
    spec = _spec(layout)
    reads = _history(h, spec)
    table = h.table(spec)  # a fresh catalog handle
    snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    compaction = snapshots[-1]
    assert compaction.summary is not None and compaction.summary.operation.value == "replace"

    # every DELETED entry a commit wrote: no metrics, every other field as it was live before
    removed_by: dict[int, set[str]] = {}
    for snapshot, entry, was in _written_entries(table, snapshots):
        if was is None:
            assert entry.data_file.lower_bounds  # live entries keep their metrics
            continue
        assert entry.snapshot_id == snapshot.snapshot_id
        _assert_unmeasured_copy(entry, was)
        removed_by.setdefault(snapshot.snapshot_id, set()).add(entry.data_file.file_path)
    parent = _live_files(table, compaction.parent_snapshot_id)
    assert removed_by[compaction.snapshot_id] == set(parent)  # the compaction removed them all
    assert len(removed_by) > 1  # and the copy-on-write upserts removed some too

    # pyiceberg (fresh handle): its entries table, and time travel to every snapshot
    entries = table.inspect.entries(snapshot_id=compaction.snapshot_id).to_pylist()
    deleted = [e for e in entries if e["status"] == int(ManifestEntryStatus.DELETED)]
    assert {e["data_file"]["file_path"] for e in deleted} == set(parent)
    assert not any(e["data_file"][m] for e in deleted for m in METRIC_FIELDS)
    _assert_reads_at_every_snapshot(table, snapshots, reads)

    # DuckDB's iceberg extension, now and at every snapshot
    con = duckdb_with_iceberg()
    try:
        for snapshot in snapshots:
            got = con.execute(
                "SELECT * FROM iceberg_scan(?, snapshot_from_id = ?)",
                [table.metadata_location, snapshot.snapshot_id],
            ).pl()
            assert_same_multiset(got, reads[snapshot.snapshot_id])
    finally:
        con.close()

    # the change feed, diffing the manifests, between neighbours and across the whole history
    pairs = [*pairwise(snapshots), (snapshots[0], compaction)]
    for old, new in pairs:
        change = read_changes(
            table,
            from_snapshot=old.snapshot_id,
            to_snapshot=new.snapshot_id,
            primary_key=("id",),
            composed=False,
        )
        kinds = change.frame.get_column("_change_type")
        ids = change.frame.get_column("id")
        got = {kind: set(ids.filter(kinds == kind).to_list()) for kind in CHANGE_KINDS}
        want = _changes_expected(reads[old.snapshot_id], reads[new.snapshot_id])
        assert got[UPDATE_BEFORE] == got[UPDATE_AFTER]
        assert {k: got[k] for k in want} == want

    # expiry deletes exactly the files only the expired snapshots referenced
    store = h.store()
    all_before = _files_under(table)
    result = store.expire_snapshots(spec, older_than=timedelta(0), retain_last=1)
    table = h.table(spec)
    left = _files_under(table)
    assert [s.snapshot_id for s in table.snapshots()] == [compaction.snapshot_id]
    removed_data = {norm(p) for paths in removed_by.values() for p in paths}
    assert removed_data <= all_before - left  # every removed data file is gone
    assert left >= {norm(p) for p in _live_files(table, compaction.snapshot_id)}
    assert left - referenced(table) == set()  # nothing left unreferenced
    assert result.files_deleted == len(all_before - left)
    assert_same_multiset(h.store().read(spec.name), reads[compaction.snapshot_id])


def test_removed_entries_re_encoded_without_their_bytes_carry_no_metrics_either(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """Where a removed entry's bytes cannot be reused (a manifest layout other than v2's: here
    every manifest, as if none were), the commit re-encodes it: without its metrics too, every
    other field as it was, and the table reads the same at every snapshot."""
    from pipeline_output.stores.iceberg.snapshot import manifests

    monkeypatch.setattr(manifests.LiveEntries, "raw", lambda self, path: None)
    spec = _spec("region")
    reads = _history(h, spec)
    assert _removed_copies_read_the_same(h.table(spec), reads)


def test_removed_entries_their_values_cannot_write_are_written_from_their_bytes_the_same(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """Where the removed data files' entries cannot be written from their values (a value its
    type does not encode: here none can), the commit writes them from their own bytes, their
    metrics stripped: the same entries, every other field as it was, and the table reads the
    same at every snapshot."""
    from pipeline_output.stores.iceberg.snapshot import commit

    refused: list[int] = []

    def refuse(*args: Any, **options: Any) -> None:
        refused.append(1)
        return None

    monkeypatch.setattr(commit, "removed_manifest", refuse)
    spec = _spec("bucket")
    reads = _history(h, spec)
    assert refused and _removed_copies_read_the_same(h.table(spec), reads)


def _removed_copies_read_the_same(table: Any, reads: Any) -> bool:
    """Every removed entry of the table's history is its file's entry with its metrics stripped
    (`_assert_unmeasured_copy`), more of them than the files live before the compaction (the
    upserts' and the compaction's), and the table reads the same at every snapshot."""
    snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    removed = 0
    for _, entry, was in _written_entries(table, snapshots):
        if was is not None:
            _assert_unmeasured_copy(entry, was)
            removed += 1
    _assert_reads_at_every_snapshot(table, snapshots, reads)
    return removed > len(_live_files(table, snapshots[-2].snapshot_id))
