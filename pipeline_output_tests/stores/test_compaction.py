"""Compaction on real parts (Postgres SQL catalog, local warehouse): small files bin-packed into
files near the target size, partition by partition, sorted by the key, with positional deletes
folded in — one `replace` snapshot, the same rows as a multiset (the polars oracle), and a re-run
that finds nothing to do. Races with writers in the same process are here too; with real writer
processes in `test_maintenance_beside_writers.py`.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline_output import DatasetSpec, Window
from pipeline_output.errors import MaintenanceConflict
from pipeline_output.stores.iceberg.maintenance.orphans import table_orphans
from pipeline_output_tests.iceberg_harness import NS, Harness
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.stores.positional_deletes import delete_positions

PROP = "pipeline-output."


# Every test on the SQL catalog and on SeaweedFS's REST catalog over S3 (the REST variant of one
# in the default run; expiry and orphan removal on S3: test_maintenance_s3.py).
pytestmark = pytest.mark.both_catalogs


def rows(ids: range | list[int], *, version: int = 0, region: str | None = None) -> pl.DataFrame:
    ids = list(ids)
    frame = pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "v": [f"r{i}-v{version}" for i in ids],
            "seq": pl.Series(ids, dtype=pl.Int64),
        }
    )
    if region is not None:
        frame = frame.with_columns(region=pl.lit(region))
    return frame


def windowed(name: str = "events", **extra: Any) -> DatasetSpec:
    """A keyed dataset fed by windows of `seq` (each window adds one data file)."""
    from pipeline_output import Delta

    return DatasetSpec(
        name=name,
        primary_key=("id",),
        strategy="snapshot_replace",
        delta=Delta(source="raw", watermark="seq"),
        **extra,
    )


def feed_windows(h: Harness, spec: DatasetSpec, n: int, size: int = 20) -> pl.DataFrame:
    """`n` window writes of `size` new keys, in shuffled key order; returns everything written."""
    written = []
    for w in range(n):
        frame = rows(range(w * size + 1, (w + 1) * size + 1)).sample(fraction=1.0, seed=w)
        h.store().write(spec, frame, window=Window(low=w * size, high=(w + 1) * size))
        written.append(frame)
    return pl.concat(written)


def read_file(data_file: Any) -> pl.DataFrame:
    """A data file's rows in file order (positions), read straight from the warehouse (a local
    directory or S3) through the FileIO the file was listed with."""
    with data_file.io.new_input(data_file.file_path).open() as stream:
        return pl.from_arrow(pq.read_table(stream))  # type: ignore[return-value]


class ListedFile:
    """A live data file (its attributes) with the FileIO of the table it was listed from."""

    def __init__(self, file: Any, io: Any) -> None:
        self.file, self.io = file, io

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def data_files(h: Harness, spec: DatasetSpec) -> list[Any]:
    table = h.table(spec)
    return [ListedFile(t.file, table.io) for t in table.scan().plan_files()]


@pytest.mark.rest_default
def test_compaction_bin_packs_window_files_into_one_sorted_file_with_the_same_rows(h: Harness):
    spec = windowed()
    expected = feed_windows(h, spec, 12)
    before_ids = h.snapshot_ids(spec)
    assert len(data_files(h, spec)) == 12

    result = h.store().compact(spec)

    assert (result.files_rewritten, result.files_added, result.bins) == (12, 1, 1)
    assert result.rows == expected.height and not result.noop
    after = h.contents(spec)
    assert after is not None
    assert_same_multiset(after, expected)
    files = data_files(h, spec)
    assert len(files) == 1
    stored = read_file(files[0])
    assert stored["id"].is_sorted()  # sorted by the primary key (the table's sort order)
    table = h.table(spec)
    snap = table.current_snapshot()
    assert h.snapshot_ids(spec) == [*before_ids, result.snapshot_id]  # exactly one snapshot
    assert snap.summary.operation.value == "replace"
    assert snap.summary[PROP + "maintenance"] == "compact"
    assert snap.summary["total-records"] == str(expected.height)
    assert table.properties[PROP + "last-compaction"].endswith("rewrote 12 file(s) into 1")

    again = h.store().compact(spec)  # a re-run finds nothing to do and commits nothing
    assert again.noop and again.snapshot_id is None
    assert h.snapshot_ids(spec) == [*before_ids, result.snapshot_id]
    assert_same_multiset(h.contents(spec), expected)


def test_compaction_plans_from_the_keys_statistics_and_commits_removed_entries_as_they_were(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The plan decodes the manifests with the first sort key's statistics only (what bins
    are ordered and streamed by); the commit writes the removed entries from their own bytes:
    read back, every field of every removed file as before the compaction but its column
    metrics, which a removed entry does not carry (`manifest_encoding.unmeasured`)."""
    from pyiceberg.manifest import DATA_FILE_TYPE, ManifestEntryStatus

    from pipeline_output.stores.iceberg.snapshot import manifests

    spec = windowed()
    feed_windows(h, spec, 6)
    table = h.table(spec)
    before = {
        e.data_file.file_path: (e.data_file, e.sequence_number, e.file_sequence_number)
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
    }
    asked: list[frozenset[int] | None] = []
    read = manifests.read_manifest

    def spy(manifest: Any, io: Any, **options: Any) -> Any:
        asked.append(options.get("bounds"))
        return read(manifest, io, **options)

    manifests.READ_MANIFESTS.clear()  # every manifest decoded by this compaction
    monkeypatch.setattr(manifests, "read_manifest", spy)
    result = h.store().compact(spec)

    assert result.files_rewritten == len(before) == 6
    key = table.schema().find_field("id").field_id
    assert asked and set(asked) == {frozenset({key})}
    table = h.table(spec)
    removed = [
        e
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
        if e.status == ManifestEntryStatus.DELETED
    ]
    assert sorted(e.data_file.file_path for e in removed) == sorted(before)
    metrics = {108, 109, 110, 137, 125, 128}  # column sizes, value/null/NaN counts, bounds
    at = {n for n, f in enumerate(DATA_FILE_TYPE[2].fields) if f.field_id in metrics}
    assert len(at) == 6
    for entry in removed:
        data_file, sequence, file_sequence = before[entry.data_file.file_path]
        assert data_file.lower_bounds and data_file.value_counts  # it had them while live
        for i in range(len(data_file)):
            assert entry.data_file[i] == ({} if i in at else data_file[i])
        assert (entry.sequence_number, entry.file_sequence_number) == (sequence, file_sequence)
        assert entry.snapshot_id == result.snapshot_id


def test_a_compaction_keeps_none_of_its_planners_reads_once_committed(h: Harness):
    """The plan's decoded entries (its manifests read with the sort key's statistics) serve only
    a compaction's plan: once the commit is in, the process keeps none of them (kept, 20,000
    planned entries outlived the compaction for the collector's next pass to walk). A
    compaction that commits nothing keeps its read for the next plan."""
    from pipeline_output.stores.iceberg.maintenance.compaction import planned_bounds
    from pipeline_output.stores.iceberg.snapshot.manifests import READ_MANIFESTS

    spec = windowed()
    feed_windows(h, spec, 6)
    table = h.table(spec)
    bounds = planned_bounds(table, spec)
    planned = table.current_snapshot().manifests(table.io)
    READ_MANIFESTS.clear()
    assert h.store().compact(spec, dry_run=True).bins == 1
    assert all(READ_MANIFESTS.kept(m, bounds=bounds) for m in planned)
    result = h.store().compact(spec)
    assert result.files_rewritten == 6
    assert not any(READ_MANIFESTS.kept(m, bounds=bounds) for m in planned)
    assert h.raw(spec).height == 6 * 20


class _Untouched(list):  # type: ignore[type-arg]
    """A manifest's entries' bytes that record being read (`touched`)."""

    touched: list[str]

    def __iter__(self) -> Any:
        self.touched.append("iterated")
        return super().__iter__()

    def __getitem__(self, at: Any) -> Any:
        self.touched.append("indexed")
        return super().__getitem__(at)


@pytest.mark.parametrize("partition_by", [(), ("bucket(3, id)",)], ids=["flat", "bucketed"])
def test_a_compactions_commit_writes_the_removed_entries_from_the_plans_values_without_their_bytes(
    h: Harness, monkeypatch: pytest.MonkeyPatch, partition_by: tuple[str, ...]
):
    """The manifest of the removed files (DELETED) is written from the values the plan
    decoded, as they are — the columns its entries were made of, not the entries' bytes: no
    removed entry's bytes are read, copied or stripped, no entry is made per removed file
    (~3.6 MB for 20,000), and the plan's files are found among the entries by identity, not
    matched by path. pyiceberg's own reader gives
    each removed file back DELETED by the compaction's snapshot, with its sequence numbers,
    partition, record count, size and format as they were, without metrics."""
    from dataclasses import replace

    from pyiceberg.manifest import ManifestEntryStatus

    from pipeline_output.stores.iceberg.maintenance import compaction
    from pipeline_output.stores.iceberg.snapshot import commit, manifests

    spec = windowed(partition_by=partition_by)
    expected = feed_windows(h, spec, 6)
    table = h.table(spec)
    before = {
        e.data_file.file_path: e
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
    }
    planned: list[Any] = []
    read_index = manifests.read_index

    def keep(table: Any, **options: Any) -> Any:
        index = read_index(table, **options)
        planned.append(index)
        return index

    touched: list[str] = []
    raw_of = manifests.LiveEntries.raw

    def untouched(self: Any, path: str) -> Any:  # the entries' bytes, each read recorded
        raw = raw_of(self, path)
        if raw is None:
            return None
        data_files = _Untouched(raw.data_files)
        data_files.touched = touched
        return replace(raw, data_files=data_files)

    written: list[list[Any]] = []
    write = getattr(commit, "removed_manifest", None)

    def spy(output: Any, raw: Any, removed: Any, **options: Any) -> Any:
        written.append(list(removed))
        assert write is not None
        return write(output, raw, removed, **options)

    matched: list[Any] = []
    paths = commit.file_paths

    def by_path(files: Any) -> Any:
        matched.append(files)
        return paths(files)

    manifests.READ_MANIFESTS.clear()
    monkeypatch.setattr(compaction, "read_index", keep)
    monkeypatch.setattr(manifests.LiveEntries, "raw", untouched)
    monkeypatch.setattr(commit, "removed_manifest", spy, raising=False)
    monkeypatch.setattr(commit, "file_paths", by_path)
    result = h.store().compact(spec)

    assert result.files_rewritten == len(before) == (18 if partition_by else 6)  # 3 buckets
    assert touched == [] and matched == []  # no entry's bytes read, no path matched
    (index,) = planned
    decoded = [raw_of(index.live, m.manifest_path) for m in index.read_manifests()]
    (removed,) = written  # the columns the plan decoded its entries from, as they are
    assert sum(map(len, removed)) == len(before)
    assert {id(values) for values in removed} == {id(raw.values) for raw in decoded}
    table = h.table(spec)
    removed = [
        e
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
        if e.status == ManifestEntryStatus.DELETED
    ]
    assert sorted(e.data_file.file_path for e in removed) == sorted(before)
    for entry in removed:
        was = before[entry.data_file.file_path]
        assert entry.snapshot_id == result.snapshot_id
        assert (entry.sequence_number, entry.file_sequence_number) == (
            was.sequence_number,
            was.file_sequence_number,
        )
        got, want = entry.data_file, was.data_file
        assert got.partition == want.partition and got.file_format == want.file_format
        assert (got.record_count, got.file_size_in_bytes) == (
            want.record_count,
            want.file_size_in_bytes,
        )
        assert not got.lower_bounds and not got.value_counts and want.lower_bounds
    assert_same_multiset(h.contents(spec), expected)


def test_compaction_packs_bins_up_to_the_target_size_and_leaves_few_files_alone(h: Harness):
    spec = windowed()
    expected = feed_windows(h, spec, 9)
    sizes = [f.file_size_in_bytes for f in data_files(h, spec)]
    assert h.store().compact(spec, min_input_files=10).noop  # 9 small files < 10, < target

    result = h.store().compact(spec, target_file_size=3 * max(sizes) + 1)

    assert result.files_rewritten == 9
    assert result.bins == result.files_added == 3  # three files per bin
    assert_same_multiset(h.contents(spec), expected)
    assert len(data_files(h, spec)) == 3


def test_compaction_never_mixes_partitions(h: Harness):
    spec = windowed(partition_by=("region",))
    expected = []
    for w in range(6):
        frame = pl.concat(
            [
                rows(range(w * 30 + r * 10 + 1, w * 30 + r * 10 + 11), region=g)
                for r, g in enumerate(("eu", "us", "ap"))
            ]
        )
        h.store().write(spec, frame, window=Window(low=w * 30, high=(w + 1) * 30))
        expected.append(frame)
    assert len(data_files(h, spec)) == 18
    with h.table(spec).transaction() as tx:  # the summary lists each changed partition
        tx.set_properties({"write.summary.partition-limit": "10"})

    result = h.store().compact(spec)  # the 3 bins are read by one scan

    assert (result.files_rewritten, result.files_added) == (18, 3)
    assert_same_multiset(h.contents(spec), pl.concat(expected))
    for f in data_files(h, spec):  # one partition per file, as every write keeps it
        stored = read_file(f)
        assert stored["region"].unique().to_list() == [f.partition[0]]
        assert stored["id"].is_sorted()  # each bin's files read in key order: no sort needed
    summary = h.table(spec).current_snapshot().summary
    assert summary["changed-partition-count"] == "3"
    for region in ("eu", "us", "ap"):
        changes = dict(kv.split("=") for kv in summary[f"partitions.region={region}"].split(","))
        assert (changes["added-data-files"], changes["deleted-data-files"]) == ("1", "6")


def test_bins_of_many_partitions_are_read_at_most_read_group_files_input_files_a_scan(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """Polars' reader holds memory per file of a scan, whatever its bytes: small bins of many
    partitions are read together up to `READ_GROUP_FILES` input files (here 7: two bins of 3
    files a scan, not all four bins in one), with the same rows and one file per bin."""
    from pipeline_output.stores.iceberg.maintenance import compaction

    spec = windowed(name="grouped", partition_by=("region",))
    regions = ("eu", "us", "ap", "sa")
    expected = []
    for w in range(3):
        frame = pl.concat(
            [
                rows(range(w * 40 + r * 10 + 1, w * 40 + r * 10 + 11), region=g)
                for r, g in enumerate(regions)
            ]
        )
        h.store().write(spec, frame, window=Window(low=w * 40, high=(w + 1) * 40))
        expected.append(frame)
    scans: list[int] = []
    read_bins = compaction._read_bins

    def spy(table: Any, bins: Any, spec_: DatasetSpec) -> pl.DataFrame:
        scans.append(sum(len(b.tasks) for b in bins))
        return read_bins(table, bins, spec_)

    monkeypatch.setattr(compaction, "READ_GROUP_FILES", 7, raising=False)
    monkeypatch.setattr(compaction, "_read_bins", spy)

    result = h.store().compact(spec, min_input_files=2)

    assert (result.files_rewritten, result.files_added) == (12, 4)
    assert scans == [6, 6]
    assert_same_multiset(h.contents(spec), pl.concat(expected))
    for f in data_files(h, spec):
        assert read_file(f)["region"].unique().to_list() == [f.partition[0]]


@pytest.mark.parametrize("partition_by", [("region",), ()], ids=["regions", "flat"])
def test_a_compactions_summary_counts_its_files_as_pyiceberg_counts_them_one_by_one(
    h: Harness, monkeypatch: pytest.MonkeyPatch, partition_by: tuple[str, ...]
):
    """The removed files are counted per partition and content, then added to the summary
    once per partition — a data manifest's removed files of one partition (unpartitioned)
    from the sums of the columns they were written DELETED from: the same summary as
    pyiceberg's collector fed file by file (the oracle, over the snapshot's own ADDED and
    DELETED entries), delete files included; each manifest is listed once (the removed delete
    files' manifest was listed twice)."""
    from pyiceberg.manifest import ManifestEntryStatus
    from pyiceberg.table.snapshots import SnapshotSummaryCollector

    from pipeline_output.stores.iceberg.snapshot import commit

    counted: list[Any] = []
    count = commit.IndexedOverwrite._counted

    def spy(self: Any) -> Any:
        counted.append(found := count(self))
        return found

    spec = windowed(name="counted", partition_by=partition_by)
    windows = 3 if partition_by else 6  # a file of each region a window, or one file a window
    size = 60 // windows
    for w in range(windows):
        frame = pl.concat(
            [
                rows(range(w * size + r * 10 + 1, w * size + r * 10 + 11), region=g)
                for r, g in enumerate(("eu", "us")[: size // 10])
            ]
        )
        h.store().write(spec, frame, window=Window(low=w * size, high=(w + 1) * size))
    files = sorted(data_files(h, spec), key=lambda f: f.file_path)
    delete_positions(h.table(spec), {files[0].file_path: [0, 2], files[3].file_path: [1]})
    with h.table(spec).transaction() as tx:
        tx.set_properties({"write.summary.partition-limit": "10"})

    monkeypatch.setattr(commit.IndexedOverwrite, "_counted", spy)
    result = h.store().compact(spec, min_input_files=2)

    assert result.files_rewritten == 6 and result.delete_files_removed == 2
    ((files_counted, groups),) = counted
    if not partition_by:  # six manifests of a file each, each counted at once
        assert [group[3] for group in groups] == [1] * 6 and len(list(files_counted)) == 2
    table = h.table(spec)
    snapshot = table.current_snapshot()
    oracle = SnapshotSummaryCollector(partition_summary_limit=10)
    schema, specs = table.schema(), table.specs()
    listed = [m.manifest_path for m in snapshot.manifests(table.io)]
    assert len(set(listed)) == len(listed)
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.snapshot_id != snapshot.snapshot_id:
                continue
            spec_of = specs[entry.data_file.spec_id]
            if entry.status == ManifestEntryStatus.ADDED:
                oracle.add_file(entry.data_file, schema=schema, partition_spec=spec_of)
            elif entry.status == ManifestEntryStatus.DELETED:
                oracle.remove_file(entry.data_file, schema=schema, partition_spec=spec_of)
    expected = oracle.build()
    assert expected["deleted-data-files"] == "6" and expected["removed-delete-files"] == "2"
    assert {k: snapshot.summary[k] for k in expected} == expected


def test_bins_read_together_are_sorted_partition_by_partition_when_their_files_overlap(
    h: Harness,
):
    """Bins of several partitions read by one scan: a partition whose files' key ranges overlap
    (read back out of key order) is sorted, the others are written as read; every output file
    in key order."""
    spec = windowed(partition_by=("region",))
    expected = []
    for w in range(6):
        frame = pl.concat(
            [
                rows(range(w * 10 + 1, w * 10 + 11), region="eu"),  # key ranges one after another
                rows(range(100 + w, 160, 6), region="us"),  # every window spans 100..159
            ]
        )
        h.store().write(spec, frame, window=Window(low=w * 10, high=(w + 1) * 10))
        expected.append(frame)

    result = h.store().compact(spec)

    assert (result.files_rewritten, result.files_added) == (12, 2)
    assert_same_multiset(h.contents(spec), pl.concat(expected))
    for f in data_files(h, spec):
        stored = read_file(f)
        assert stored["region"].unique().to_list() == [f.partition[0]]
        assert stored["id"].is_sorted(), f.partition[0]


@pytest.mark.parametrize("unsorted_inside", [False, True])
def test_files_in_key_order_are_compacted_sorted_with_their_nan_counts(
    h: Harness, unsorted_inside: bool
):
    """Unpartitioned files whose key ranges follow each other (read and encoded in one streaming
    query): one sorted file with the rows and the NaN count of its float column; files whose
    ranges follow each other but whose rows are not in key order inside (another engine's) are
    sorted all the same."""
    spec = DatasetSpec(name="ordered", primary_key=("id",), strategy="append_always")
    written = []
    for w in range(6):
        frame = rows(range(w * 10, w * 10 + 10)).with_columns(
            x=pl.when(pl.col("id") % 7 == 0).then(float("nan")).otherwise(pl.col("id") / 3)
        )
        table = h.table(spec) if w and unsorted_inside else None
        if table is None:
            h.store().write(spec, frame)
        else:  # another engine's file: its rows as given, out of key order inside
            table.append(frame.reverse().to_arrow().cast(table.schema().as_arrow()))
        written.append(frame)
    expected = pl.concat(written)

    result = h.store().compact(spec)

    assert (result.files_rewritten, result.files_added, result.rows) == (6, 1, 60)
    assert_same_multiset(h.contents(spec), expected)
    (only,) = data_files(h, spec)
    stored = read_file(only)
    assert stored["id"].is_sorted()
    x = h.table(spec).schema().find_field("x").field_id
    assert only.nan_value_counts[x] == expected["x"].is_nan().sum()


def test_a_plan_of_files_without_deletes_makes_no_scan_task_per_file(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """Files without delete files are planned from their data files as the manifests were read,
    without a pyiceberg scan task each (20,000 of them: ~8 ms to make, and more to free), and
    local ones streamed and committed without any (the stream reads their paths); files on
    object storage are read by polars' Iceberg scan, which plans from a task per file. With
    delete files, each task carries its deletes (`test_compaction_folds_positional_deletes_...`)."""
    from pyiceberg.table import FileScanTask

    made: list[Any] = []
    init = FileScanTask.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    spec = DatasetSpec(name="plain", primary_key=("id",), strategy="append_always")
    for w in range(6):
        h.store().write(spec, rows(range(w * 10, w * 10 + 10)))
    monkeypatch.setattr(FileScanTask, "__init__", counted)

    assert h.store().compact(spec, dry_run=True).files_rewritten == 6
    assert made == []
    result = h.store().compact(spec)

    assert (result.files_rewritten, result.files_added, result.rows) == (6, 1, 60)
    assert len(made) == (0 if h.table(spec).location().startswith("file:") else 6)
    assert_same_multiset(h.contents(spec), rows(range(60)))


def test_a_compaction_leaves_nothing_of_its_plan_for_the_collector(h: Harness):
    """Once a compaction returns, its plan's entries and data files are freed by reference
    count: none is left in a reference cycle for the collector's next pass (the commit's
    snapshot producer is one, and held the planned index: 20,000 files' ~80,000 objects, a
    ~12 ms pass right after the compaction's `paused()` block)."""
    import gc

    from pyiceberg.manifest import DataFile, ManifestEntry

    spec = windowed()
    feed_windows(h, spec, 6)
    store = h.store()
    enabled, flags = gc.isenabled(), gc.get_debug()
    gc.collect()
    gc.disable()
    try:
        result = store.compact(spec)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (ManifestEntry, DataFile))]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        if enabled:
            gc.enable()

    assert result.files_rewritten == 6
    assert left == []


def test_compaction_folds_positional_deletes_and_drops_the_delete_files(h: Harness):
    spec = windowed()
    written = feed_windows(h, spec, 3)
    files = sorted(data_files(h, spec), key=lambda f: f.file_path)
    first = read_file(files[0])
    second = read_file(files[1])
    delete_positions(h.table(spec), {files[0].file_path: [0, 3], files[1].file_path: [5]})
    gone = {first["id"][0], first["id"][3], second["id"][5]}
    expected = written.filter(~pl.col("id").is_in(list(gone)))
    assert_same_multiset(h.contents(spec), expected)  # pyiceberg applies the deletes on read

    # 3 files < min_input_files, but files with delete files are always rewritten
    result = h.store().compact(spec)

    assert (result.files_rewritten, result.delete_files_removed, result.rows) == (
        3,
        2,
        expected.height,
    )
    assert_same_multiset(h.contents(spec), expected)
    tasks = list(h.table(spec).scan().plan_files())
    assert len(tasks) == 1 and not tasks[0].delete_files
    summary = h.table(spec).current_snapshot().summary
    assert summary["total-delete-files"] == "0"
    assert summary["removed-position-deletes"] == "3"


def test_compaction_folds_the_stores_own_merge_on_read_deletes(h: Harness):
    """Upserts written merge-on-read (issue 13) leave file-scoped positional delete files and new
    row versions; compaction rewrites those files with the deletes applied, and the delete files
    go in the same `replace` commit."""
    from dataclasses import replace as with_

    spec = with_(windowed(), write_strategy_hint="merge-on-read")
    written = feed_windows(h, spec, 4, size=50)
    update = pl.concat([rows([3, 60], version=1), rows([1000], version=1)])  # 2 updated, 1 new
    h.store().write(spec, update)
    expected = pl.concat([written.filter(~pl.col("id").is_in([3, 60])), update])
    assert_same_multiset(h.contents(spec), expected)
    tasks = list(h.table(spec).scan().plan_files())
    assert sum(len(t.delete_files) for t in tasks) == 2  # one per data file it deleted from

    result = h.store().compact(spec)

    assert result.delete_files_removed == 2 and result.files_added == 1
    assert_same_multiset(h.contents(spec), expected)
    tasks = list(h.table(spec).scan().plan_files())
    assert len(tasks) == 1 and not tasks[0].delete_files
    assert h.table(spec).current_snapshot().summary["total-delete-files"] == "0"


def test_a_large_file_with_deletes_is_rewritten_alone(h: Harness):
    spec = windowed()
    written = feed_windows(h, spec, 2, size=50)
    big = max(data_files(h, spec), key=lambda f: f.file_size_in_bytes)
    delete_positions(h.table(spec), {big.file_path: [1]})
    dropped = read_file(big)["id"][1]

    # a target so small that no file is "small": only the file with deletes is an input
    result = h.store().compact(spec, target_file_size=10)

    assert (result.files_rewritten, result.files_added, result.delete_files_removed) == (1, 1, 1)
    assert_same_multiset(h.contents(spec), written.filter(pl.col("id") != dropped))


def test_where_limits_the_rewrite_and_keeps_delete_files_other_files_need(h: Harness):
    spec = windowed()
    written = feed_windows(h, spec, 8)  # ids 1..160, one file per 20
    files = sorted(data_files(h, spec), key=lambda f: read_file(f)["id"].min())
    # one delete file spanning a file inside the where (ids 1..20) and one outside (141..160)
    delete_positions(
        h.table(spec), {files[0].file_path: [0], files[-1].file_path: [0]}, scoped=False
    )
    doomed = [read_file(f)["id"][0] for f in files[::7]]
    expected = written.filter(~pl.col("id").is_in(doomed))

    result = h.store().compact(spec, where="id <= 100", min_input_files=2)

    assert result.files_rewritten == 5  # the files of ids 1..100
    assert result.delete_files_removed == 0  # still needed by the file of ids 141..160
    assert_same_multiset(h.contents(spec), expected)
    assert len(data_files(h, spec)) == 4
    again = h.store().compact(spec)  # now every file: the delete file goes too
    assert again.delete_files_removed == 1
    assert_same_multiset(h.contents(spec), expected)


def test_dry_run_plans_and_writes_nothing(h: Harness):
    spec = windowed()
    feed_windows(h, spec, 6)
    before = h.snapshot_ids(spec)
    plan = h.store().compact(spec, dry_run=True)
    assert plan.dry_run and plan.files_rewritten == 6 and plan.bins == 1
    assert h.snapshot_ids(spec) == before
    assert table_orphans(h.table(spec), grace_s=0) == []


def test_a_compaction_that_loses_a_race_replans_and_keeps_the_writers_rows(h: Harness):
    """A writer commits an upsert that rewrites a file the compaction is rewriting (between its
    plan and its commit): the compaction's first attempt is refused and its files deleted; the
    second attempt plans on the writer's snapshot. The writer's rows survive."""
    spec = windowed()
    written = feed_windows(h, spec, 6)
    update = rows([3, 4], version=1)
    raced = []

    def writer_in_between(done: int, planned: int) -> None:
        if not raced:
            raced.append(h.store().write(spec, update, window=Window(low=0, high=20)))

    result = h.store().compact(spec, progress=writer_in_between)

    assert result.attempts == 2
    expected = pl.concat([written.filter(~pl.col("id").is_in([3, 4])), update])
    assert_same_multiset(h.contents(spec), expected)
    assert len(data_files(h, spec)) == 1
    assert table_orphans(h.table(spec), grace_s=0) == []  # the lost attempt's files are gone


def test_a_compaction_refuses_to_commit_over_rows_deleted_from_its_inputs_meanwhile(h: Harness):
    """A merge-on-read upsert between the plan and the commit deletes a row of an input file
    (a positional delete file for it, no file removed): the compaction, which read the file
    without that delete, is refused (its bins' files and delete sets compared with the current
    snapshot's) and commits nothing; the next one folds the delete in."""
    from dataclasses import replace as with_

    spec = with_(windowed(), write_strategy_hint="merge-on-read")
    written = feed_windows(h, spec, 6, size=50)
    update = rows([3], version=1)

    def upsert_in_between(done: int, planned: int) -> None:
        h.store().write(spec, update)

    with pytest.raises(MaintenanceConflict, match="deleted rows of"):
        h.store().compact(spec, progress=upsert_in_between, max_attempts=1)

    expected = pl.concat([written.filter(pl.col("id") != 3), update])
    assert_same_multiset(h.contents(spec), expected)
    assert "replace" not in {s.summary.operation.value for s in h.table(spec).snapshots()}
    assert table_orphans(h.table(spec), grace_s=0) == []
    result = h.store().compact(spec)
    assert result.delete_files_removed == 1
    assert_same_multiset(h.contents(spec), expected)


def test_a_compaction_whose_first_input_vanished_before_its_read_is_refused_and_commits_nothing(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """An input file deleted between the plan and the read (another process's expiry of a file
    a writer replaced meanwhile) refuses the compaction's attempt (`MaintenanceConflict`, as
    for a lost race), the first file of a streamed bin too: its scan's schema is read from
    that file before the stream starts, and that failed with polars' own FileNotFoundError."""
    from pipeline_output.stores.iceberg.maintenance import compaction

    spec = DatasetSpec(name="plain", primary_key=("id",), strategy="append_always")
    for w in range(6):
        h.store().write(spec, rows(range(w * 10, w * 10 + 10)))
    groups = compaction.read_groups

    def first_input_gone(table: Any, bins: Any) -> Any:
        table.io.delete(bins[0].tasks[0].file.file_path)
        return groups(table, bins)

    monkeypatch.setattr(compaction, "read_groups", first_input_gone)

    with pytest.raises(MaintenanceConflict, match="vanished"):
        h.store().compact(spec, max_attempts=1)
    assert "replace" not in {s.summary.operation.value for s in h.table(spec).snapshots()}
    assert table_orphans(h.table(spec), grace_s=0) == []


def test_a_compaction_out_of_attempts_fails_cleanly_and_commits_nothing(h: Harness):
    spec = windowed()
    written = feed_windows(h, spec, 5)
    versions = iter(range(1, 100))

    def always_race(done: int, planned: int) -> None:
        h.store().write(spec, rows([7], version=next(versions)), window=Window(low=0, high=20))

    with pytest.raises(MaintenanceConflict, match="removed"):
        h.store().compact(spec, progress=always_race, max_attempts=2)

    expected = pl.concat([written.filter(pl.col("id") != 7), rows([7], version=2)])
    assert_same_multiset(h.contents(spec), expected)
    ops = {s.summary.operation.value for s in h.table(spec).snapshots()}
    assert "replace" not in ops
    assert table_orphans(h.table(spec), grace_s=0) == []


def test_compacting_a_missing_table_says_so(h: Harness):
    from pipeline_output.errors import DatasetNotWritten

    with pytest.raises(DatasetNotWritten, match="no Iceberg table"):
        h.store().compact(windowed("nothing_here"))
    assert not h.exists("nothing_here")
    assert NS == "datasets"


def test_compacted_files_carry_pyiceberg_s_statistics_and_scans_prune_by_them(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The files a compaction of many partitions writes (encoded by one polars query,
    `DataFileWriter._write_many`; their statistics computed with a column plan made once:
    `file_statistics`) carry what pyiceberg computes from their footers — bounds of strings
    (truncated), dates, timestamps, decimals, floats with NaN and nulls, counts, sizes, offsets —
    and filters on those columns read the polars oracle's rows from only the files whose bounds
    may match."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )

    from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter

    encoded: list[int] = []
    together = DataFileWriter._write_many

    def probe(self: DataFileWriter, chunks: list[Any]) -> list[Any]:
        encoded.append(len(chunks))
        return together(self, chunks)

    monkeypatch.setattr(DataFileWriter, "_write_many", probe)

    spec = DatasetSpec(
        name="typed", primary_key=("id",), strategy="append_always", partition_by=("region",)
    )
    written = []
    for w in range(5):  # each region's keys in a range of their own: bounds that prune
        frame = pl.concat(
            [
                rows(range(r * 1000 + w * 10, r * 1000 + w * 10 + 10), region=g)
                for r, g in enumerate(("eu", "us", "ap"))
            ]
        ).with_columns(
            day=pl.date(2024, 1, 1) + pl.duration(days=pl.col("id") // 10),
            at=pl.datetime(2024, 1, 1) + pl.duration(seconds=pl.col("id") * 37),
            amount=(pl.col("id") * 3 - 2000).cast(pl.Decimal(12, 2)) / 7,
            x=pl.when(pl.col("id") % 7 == 0)
            .then(float("nan"))
            .when(pl.col("id") % 11 == 0)
            .then(None)
            .otherwise(pl.col("id") / 3),
            note=pl.when(pl.col("id") % 5 == 0)
            .then(None)
            .otherwise(
                pl.format(
                    "{}-{}: a note past sixteen characters",
                    pl.col("region"),
                    pl.col("id").cast(pl.String).str.zfill(5),
                )
            ),
        )
        h.store().write(spec, frame)
        written.append(frame)
    expected = pl.concat(written)

    result = h.store().compact(spec)

    assert (result.files_rewritten, result.files_added) == (15, 3)
    assert encoded[-1] == 3  # the compaction's 3 files in one query
    table = h.table(spec)
    schema = table.schema()
    plan = compute_statistics_plan(schema, table.properties)
    mapping = parquet_path_to_id_mapping(schema)
    x = schema.find_field("x").field_id
    for f in data_files(h, spec):
        with f.io.new_input(f.file_path).open() as stream:
            footer = pq.ParquetFile(stream).metadata
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=footer, stats_columns=plan, parquet_column_mapping=mapping
        ).to_serialized_dict()
        for key, want in stats.items():
            if key != "nan_value_counts":
                assert getattr(f, key) == want, key
        stored = read_file(f)
        assert f.nan_value_counts == {x: stored["x"].is_nan().sum()}
        note = f.lower_bounds[schema.find_field("note").field_id].decode()
        assert len(note) == 16 and note.startswith(f"{f.partition[0]}-")  # truncate(16)
    for where, oracle, files in (
        ("id >= 2000", pl.col("id") >= 2000, 1),
        ("day < '2024-01-05'", pl.col("day") < pl.date(2024, 1, 5), 1),
        ("at > '2024-01-01T20:00:00'", pl.col("at") > pl.datetime(2024, 1, 1, 20), 1),
        ("amount < -200", pl.col("amount") < -200, 1),
        ("note < 'b'", pl.col("note") < "b", 1),
        ("note >= 'us-01025'", pl.col("note") >= "us-01025", 1),
        ("x > 600", (pl.col("x") > 600) & pl.col("x").is_not_nan(), 1),  # (NaN > 600: no)
    ):
        scan = table.scan(row_filter=where)
        assert len(list(scan.plan_files())) == files, where
        got = pl.from_arrow(scan.to_arrow())
        assert isinstance(got, pl.DataFrame)
        assert_same_multiset(got.select(expected.columns), expected.filter(oracle))
