"""Manifests rewritten from their entries' own bytes (`table/manifest_encoding.py`) read back, by
pyiceberg and by fastavro, entry for entry as the manifests they came from: every field of every
data file equal, the status and sequence numbers as the rewrite says — on a partitioned table
whose entries carry partition values, bounds and NaN counts, and through a copy-on-write commit
that rewrites the manifests holding the files it removes; a damaged manifest is refused by name.
A planner's read (`bounds`) gives the same entries and bytes with only the asked columns'
statistics."""

from __future__ import annotations

from typing import Any

import fastavro
import polars as pl
import pytest

from pipeline_output import DatasetSpec
from pipeline_output.errors import CorruptManifest
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    EntryValues,
    PartialDataFile,
    Statistic,
    file_statistics,
    read_manifest,
)
from pipeline_output.stores.iceberg.table.manifest_encoding import (
    removed_manifest,
    rewrite_manifest,
)
from pipeline_output_tests.iceberg_harness import customers, data_file_values


def _table(h: Any) -> Any:
    spec = DatasetSpec(
        name="bytes", primary_key=("id",), strategy="append_always", partition_by=("bucket(2, id)",)
    )
    for j in range(3):
        rows = customers(range(j * 10 + 1, j * 10 + 11))
        h.store().write(
            spec,
            rows.with_columns(
                amount=pl.when(pl.col("id") % 4 == 0).then(float("nan")).otherwise(pl.col("amount"))
            ),
        )
    return h.table(spec)


def test_a_manifest_rewritten_from_bytes_reads_back_entry_for_entry(h):
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

    table = _table(h)
    io = table.io
    for manifest in table.current_snapshot().manifests(io):
        entries, raw = read_manifest(manifest, io)
        assert raw is not None and len(raw.data_files) == len(entries)
        expected = manifest.fetch_manifest_entry(io, discard_deleted=True)
        assert [data_file_values(e.data_file) for e in entries] == [
            data_file_values(e.data_file) for e in expected
        ]
        output = io.new_output(manifest.manifest_path.replace(".avro", "-copy.avro"))
        written = rewrite_manifest(
            output,
            [(raw, list(zip(entries, raw.data_files, strict=True)))],
            spec=table.specs()[manifest.partition_spec_id],
            schema=table.schema(),
            snapshot_id=42,
            content=ManifestContent.DATA,
        )
        assert written is not None
        assert written.existing_files_count == len(entries) and written.added_files_count == 0
        back = written.fetch_manifest_entry(io, discard_deleted=False)
        assert [data_file_values(e.data_file) for e in back] == [
            data_file_values(e.data_file) for e in expected
        ]
        assert {e.status for e in back} == {ManifestEntryStatus.EXISTING}
        assert [(e.snapshot_id, e.sequence_number, e.file_sequence_number) for e in back] == [
            (e.snapshot_id, e.sequence_number, e.file_sequence_number) for e in expected
        ]
        with open(written.manifest_path.removeprefix("file://"), "rb") as fh:
            raw_back = list(fastavro.reader(fh))  # an independent Avro reader agrees
        assert [r["data_file"]["file_path"] for r in raw_back] == [
            e.data_file.file_path for e in expected
        ]


def _avro_without_sync(path: str) -> bytes:
    """An Avro file's bytes without its sync marker (random per file), wherever it is."""
    with open(path.removeprefix("file://"), "rb") as fh:
        data = fh.read()
    return data.replace(data[-16:], b"")  # (every block ends with the marker: so does the file)


@pytest.mark.parametrize("planned", [False, True], ids=["whole", "planners"])
def test_removed_entries_written_from_their_values_are_the_bytes_stripped_from_their_own(
    h, planned
):
    """The manifest of removed files (DELETED) written from the entries' values alone
    (`removed_manifest`: no entry's bytes read; a planner's, the columns it decoded) is byte
    for byte the one written from each
    entry's own bytes with its metrics stripped (`rewrite_manifest`, DELETED, checked field by
    field against the bytes) — entries of several manifests (several sequence numbers) and
    partitions, decoded whole or by a planner —, and pyiceberg reads every entry back DELETED
    by the writing snapshot with its sequence numbers, path, format, partition, record count,
    size, split offsets and sort order as they were, and no metrics."""
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

    table = _table(h)
    io = table.io
    bounds = frozenset({table.schema().find_field("id").field_id}) if planned else None
    manifests = table.current_snapshot().manifests(io)
    read = [read_manifest(m, io, bounds=bounds) for m in manifests]
    entries = [e for es, _ in read for e in es]
    raws = [raw for _, raw in read if raw is not None]
    assert len(raws) == len(read) and len(entries) == 6  # 3 writes of 2 buckets
    assert len({(e.sequence_number, e.file_sequence_number) for e in entries}) == 3
    assert len({tuple(e.data_file.partition) for e in entries}) == 2
    spec = table.specs()[manifests[0].partition_spec_id]
    options = {"spec": spec, "schema": table.schema(), "snapshot_id": 42}
    at = manifests[0].manifest_path.replace(".avro", "")
    # a planner's read holds the columns its entries were made of; else taken from the entries
    columns = [raw.values if planned else EntryValues.of(es) for es, raw in read if raw]
    assert all(c is not None for c in columns) and [len(c) for c in columns if c] == [
        len(es) for es, _ in read
    ]
    removing = [c for c in columns if c is not None]
    values = removed_manifest(io.new_output(f"{at}-values.avro"), raws[0], removing, **options)
    stripped = rewrite_manifest(
        io.new_output(f"{at}-bytes.avro"),
        [(raw, list(zip(es, raw.data_files, strict=True))) for es, raw in read if raw],
        content=ManifestContent.DATA,
        status=ManifestEntryStatus.DELETED,
        **options,
    )
    assert values is not None and stripped is not None
    assert _avro_without_sync(values.manifest_path) == _avro_without_sync(stripped.manifest_path)
    assert values.deleted_files_count == 6 and values.existing_files_count == 0
    assert values.deleted_rows_count == stripped.deleted_rows_count == 30
    assert values.partitions == stripped.partitions
    assert values.min_sequence_number == stripped.min_sequence_number

    live = {e.data_file.file_path: e for m in manifests for e in m.fetch_manifest_entry(io)}
    back = values.fetch_manifest_entry(io, discard_deleted=False)
    assert sorted(e.data_file.file_path for e in back) == sorted(live)
    metrics = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
    metrics += ("lower_bounds", "upper_bounds")
    for entry in back:
        was = live[entry.data_file.file_path]
        assert (entry.status, entry.snapshot_id) == (ManifestEntryStatus.DELETED, 42)
        assert (entry.sequence_number, entry.file_sequence_number) == (
            was.sequence_number,
            was.file_sequence_number,
        )
        mine, theirs = data_file_values(entry.data_file), data_file_values(was.data_file)
        assert [mine[m] for m in metrics] == [{}] * 6 and theirs["value_counts"]
        kept = [k for k in mine if k not in metrics]
        assert [mine[k] for k in kept] == [theirs[k] for k in kept]


def test_a_copy_on_write_commit_rewrites_manifests_that_read_back_the_same_rows(h):
    table = _table(h)
    before = {
        e.data_file.file_path
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
    }
    upsert = DatasetSpec(name="bytes", primary_key=("id",), write_strategy_hint="copy-on-write")
    res = h.store().write(upsert, customers([1, 12, 23], version=3))
    assert res.files_rewritten >= 1
    table = h.table(upsert)
    after = [
        e
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
    ]
    assert len({e.data_file.file_path for e in after}) == len(after)
    kept = [e for e in after if e.data_file.file_path in before]
    assert kept and all(e.sequence_number is not None for e in kept)
    got = h.store().read(upsert).sort("id")
    assert got.height == 30 and got.filter(pl.col("id") == 12)["name"].item() == "c12-v3"


def test_a_manifest_with_a_damaged_sync_marker_is_refused_naming_it(h):
    table = _table(h)
    manifest = table.current_snapshot().manifests(table.io)[0]
    path = manifest.manifest_path.removeprefix("file://")
    with open(path, "r+b") as fh:  # the block's trailing sync marker: the file's last 16 bytes
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(CorruptManifest, match="bad Avro sync marker") as refused:
        read_manifest(manifest, table.io)
    assert manifest.manifest_path in str(refused.value)


def test_a_planners_read_gives_the_same_entries_and_bytes_with_only_the_asked_statistics(h):
    table = _table(h)
    io = table.io
    key = table.schema().find_field("id").field_id
    cut = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
    cut += ("lower_bounds", "upper_bounds")
    for manifest in table.current_snapshot().manifests(io):
        whole, raw = read_manifest(manifest, io)
        planned, planned_raw = read_manifest(manifest, io, bounds=frozenset({key}))
        assert raw is not None and planned_raw is not None
        assert planned_raw.data_files == raw.data_files and planned_raw.meta == raw.meta
        assert planned_raw.codec is raw.codec
        assert len(planned) == len(whole) > 0
        for got, want in zip(planned, whole, strict=True):
            assert isinstance(got.data_file, PartialDataFile)
            assert (got.status, got.snapshot_id, got.sequence_number) == (
                want.status,
                want.snapshot_id,
                want.sequence_number,
            )
            assert got.file_sequence_number == want.file_sequence_number
            assert got.data_file.spec_id == want.data_file.spec_id
            mine, theirs = data_file_values(got.data_file), data_file_values(want.data_file)
            assert {k: v for k, v in mine.items() if k not in cut} == {
                k: v for k, v in theirs.items() if k not in cut
            }
            assert got.data_file.column_sizes is None and got.data_file.value_counts is None
            assert got.data_file.nan_value_counts is None
            for name in ("lower_bounds", "upper_bounds", "null_value_counts"):
                assert getattr(got.data_file, name) == {key: getattr(want.data_file, name)[key]}


def test_a_planners_read_decodes_no_column_sizes_value_counts_or_nan_counts(h, monkeypatch):
    """The statistics a plan never reads are skipped undecoded: polars' reader is asked for the
    data file's fields as columns of their own, without column sizes, value counts and NaN
    counts (half of an entry's statistics); without bounds, without any statistics map. The
    entries and their bytes are the same as ever (the test above)."""
    from pipeline_output.stores.iceberg.table import manifest_decoding

    table = _table(h)
    io = table.io
    key = table.schema().find_field("id").field_id
    asked: list[list[str] | None] = []
    real = pl.read_avro

    def spy(source: Any, *, columns: Any = None, **options: Any) -> pl.DataFrame:
        asked.append(None if columns is None else list(columns))
        return real(source, columns=columns, **options)

    monkeypatch.setattr(manifest_decoding.pl, "read_avro", spy)
    manifests = table.current_snapshot().manifests(io)
    for bounds in (frozenset({key}), frozenset()):
        asked.clear()
        for manifest in manifests:
            planned, raw = read_manifest(manifest, io, bounds=bounds)
            whole, whole_raw = read_manifest(manifest, io)
            assert raw is not None and whole_raw is not None
            assert raw.data_files == whole_raw.data_files
            assert [e.data_file.file_path for e in planned] == [
                e.data_file.file_path for e in whole
            ]
        assert len(asked) == len(manifests) > 0
        maps = {"null_value_counts", "lower_bounds", "upper_bounds"} if bounds else set()
        for columns in asked:
            assert columns is not None and "data_file" not in columns
            assert {"file_path", "record_count", "file_size_in_bytes", "partition"} <= set(columns)
            assert not {"column_sizes", "value_counts", "nan_value_counts"} & set(columns)
            assert maps == set(columns) & {"null_value_counts", "lower_bounds", "upper_bounds"}


def test_a_planners_read_of_a_manifest_with_deleted_entries_gives_the_live_ones_and_their_bytes(h):
    """pyiceberg's writer keeps a removed file's entry (DELETED) among the others: a planner's
    read gives the live entries, in order, each with its own bytes, as the whole read does."""
    from pyiceberg.manifest import ManifestEntryStatus, write_manifest

    table = _table(h)
    io = table.io
    key = table.schema().find_field("id").field_id
    source = max(table.current_snapshot().manifests(io), key=lambda m: m.added_files_count or 0)
    entries, _ = read_manifest(source, io)
    assert len(entries) >= 2
    output = io.new_output(f"{table.location()}/metadata/with-deleted-m0.avro")
    with write_manifest(
        format_version=2,
        spec=table.specs()[source.partition_spec_id],
        schema=table.schema(),
        output_file=output,
        snapshot_id=source.added_snapshot_id,
        avro_compression="deflate",
    ) as writer:
        for n, entry in enumerate([*entries, entries[0]]):
            if n in (0, len(entries)):  # the first and the last entry DELETED
                writer.delete(entry)
            else:
                writer.existing(entry)
    mixed = writer.to_manifest_file()
    mixed.sequence_number = source.sequence_number
    whole, whole_raw = read_manifest(mixed, io)
    planned, planned_raw = read_manifest(mixed, io, bounds=frozenset({key}))
    assert whole_raw is not None and planned_raw is not None
    assert [e.status for e in whole] == [ManifestEntryStatus.EXISTING] * (len(entries) - 1)
    assert all(isinstance(e.data_file, PartialDataFile) for e in planned)
    assert [e.data_file.file_path for e in planned] == [e.data_file.file_path for e in whole]
    assert [e.status for e in planned] == [e.status for e in whole]
    assert planned_raw.data_files == whole_raw.data_files


def test_a_planners_read_reads_its_entries_bytes_only_when_asked(h, monkeypatch):
    """A planner's read keeps no entry's bytes (a compaction that removes whole manifests
    writes their entries from the values it decoded): counted without them, read from the
    manifest when first asked for — what rewriting its kept entries needs —, the whole read's
    bytes, read once."""
    from pipeline_output.stores.iceberg.table import manifest_decoding

    table = _table(h)
    io = table.io
    key = table.schema().find_field("id").field_id
    fetched: list[str] = []
    fetch = manifest_decoding.manifest_bytes

    def counted(io: Any, manifest: Any) -> bytes:
        fetched.append(manifest.manifest_path)
        return fetch(io, manifest)

    monkeypatch.setattr(manifest_decoding, "manifest_bytes", counted)
    for manifest in table.current_snapshot().manifests(io):
        data = fetch(io, manifest)
        planned, raw = read_manifest(manifest, io, bounds=frozenset({key}), data=data)
        assert raw is not None and len(raw.data_files) == len(planned) > 0
        assert fetched == []  # counted, not read
        _, whole_raw = read_manifest(manifest, io)
        assert whole_raw is not None
        assert list(raw.data_files) == list(whole_raw.data_files)
        assert raw.data_files[0] == whole_raw.data_files[0]
        assert fetched == [manifest.manifest_path]  # read once, when asked
        fetched.clear()


def test_a_planners_files_make_their_key_statistics_only_when_asked(h):
    """A planner's read makes no statistics mapping per file (a compaction plans 20,000 files
    and reads their bounds through `file_statistics`): each is made when asked, equal to the
    whole read's; `file_statistics` gives the same values for planned and whole files, and a
    statistic assigned to a planned file leaves the other two as they were."""
    import gc

    table = _table(h)
    io = table.io
    key = table.schema().find_field("id").field_id
    kinds = ("lower_bounds", "upper_bounds", "null_value_counts")
    for manifest in table.current_snapshot().manifests(io):
        whole, _ = read_manifest(manifest, io)
        gc.collect()
        before = sum(isinstance(o, Statistic) for o in gc.get_objects())
        planned, _ = read_manifest(manifest, io, bounds=frozenset({key}))
        gc.collect()
        assert sum(isinstance(o, Statistic) for o in gc.get_objects()) == before
        files = [e.data_file for e in planned]
        wholes = [e.data_file for e in whole]
        for kind in kinds:
            expected = [getattr(f, kind).get(key) for f in wholes]
            assert file_statistics(files, kind, key) == expected
            assert file_statistics(wholes, kind, key) == expected
            assert file_statistics(files, kind, key + 1) == [None] * len(files)
            assert [dict(getattr(f, kind)) for f in files] == [{key: v} for v in expected]
        first = files[0]
        lower, upper = dict(first.lower_bounds), dict(first.upper_bounds)
        first.lower_bounds = {key: b"\x00" * 4, key + 1: b"\x01" * 4}
        assert dict(first.lower_bounds) == {key: b"\x00" * 4, key + 1: b"\x01" * 4}
        assert dict(first.upper_bounds) == upper and lower != dict(first.lower_bounds)
        assert dict(first.null_value_counts) == {key: wholes[0].null_value_counts[key]}
        assert file_statistics([first], "upper_bounds", key) == [upper[key]]


def test_a_planners_index_gives_whole_entries_back_for_re_encoding(h):
    from pipeline_output.stores.iceberg.snapshot.manifests import READ_MANIFESTS, ManifestIndex

    table = _table(h)
    key = table.schema().find_field("id").field_id
    READ_MANIFESTS.clear()
    index = ManifestIndex.read(table.metadata, table.io, bounds=frozenset({key}))
    assert len(index.tasks()) == 6  # 3 writes of 2 buckets
    for manifest in index.manifests:
        planned = index.live[manifest.manifest_path]
        assert planned and all(isinstance(e.data_file, PartialDataFile) for e in planned)
        whole, _ = read_manifest(manifest, table.io)
        back = index.live.whole(planned)
        assert not any(isinstance(e.data_file, PartialDataFile) for e in back)
        assert [data_file_values(e.data_file) for e in back] == [
            data_file_values(e.data_file) for e in whole
        ]
        assert [(e.status, e.sequence_number, e.file_sequence_number) for e in back] == [
            (e.status, e.sequence_number, e.file_sequence_number) for e in whole
        ]
    # a whole read of the same manifests is not served the planner's entries
    again = ManifestIndex.read(table.metadata, table.io)
    again.tasks()
    for manifest in again.manifests:
        assert not any(
            isinstance(e.data_file, PartialDataFile) for e in again.live[manifest.manifest_path]
        )


def test_a_planners_index_decodes_its_manifests_on_the_planning_thread(h, monkeypatch):
    """The manifests' bytes are fetched on the reader pool, but decoded on the thread that
    plans, one after the other: decoded on the pool's threads, each thread's allocator arena
    kept its buffers (~30 MB more resident for a compaction of 20,000 files)."""
    import threading

    from pipeline_output.stores.iceberg.snapshot.manifests import READ_MANIFESTS, ManifestIndex
    from pipeline_output.stores.iceberg.table import manifest_decoding

    table = _table(h)
    key = table.schema().find_field("id").field_id
    threads: list[threading.Thread] = []
    real = manifest_decoding.read_planned

    def spy(*args: Any, **options: Any) -> Any:
        threads.append(threading.current_thread())
        return real(*args, **options)

    monkeypatch.setattr(manifest_decoding, "read_planned", spy)
    READ_MANIFESTS.clear()
    index = ManifestIndex.read(table.metadata, table.io, bounds=frozenset({key}))
    assert len(index.tasks()) == 6
    assert len(threads) == len(index.manifests) > 1
    assert set(threads) == {threading.current_thread()}


_FILE_FIELDS = ("content", "file_format", "partition", "record_count", "file_size_in_bytes")
_FILE_FIELDS += ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
_FILE_FIELDS += ("split_offsets", "sort_order_id")


def test_a_planners_entries_hold_little_beyond_their_path_and_bytes(h, tmp_path):
    """A compaction plans 20,000 files from one planner's read: each entry's objects beyond its
    path and its `data_file` bytes stay small (measured by tracemalloc on 2,000 entries; the
    one-key statistics dicts and per-file copies of repeated values took it to ~1,500 bytes; ~820
    now)."""
    import gc
    import tracemalloc

    from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus, write_manifest

    table = _table(h)
    io = table.io
    key = table.schema().find_field("id").field_id
    source = table.current_snapshot().manifests(io)[0]
    template = source.fetch_manifest_entry(io)[0]
    output = io.new_output(str(tmp_path / "many.avro"))
    count = 2_000
    with write_manifest(
        2,
        table.spec(),
        table.schema(),
        output,
        snapshot_id=template.snapshot_id,
        avro_compression="deflate",
    ) as writer:
        for i in range(count):
            data_file = template.data_file
            copy = DataFile.from_args(
                **{name: getattr(data_file, name) for name in _FILE_FIELDS},
                file_path=f"{data_file.file_path}-{i:05d}",  # a path of its own
                lower_bounds={**data_file.lower_bounds, key: i.to_bytes(4, "little")},
                upper_bounds={**data_file.upper_bounds, key: (i + 9).to_bytes(4, "little")},
            )
            copy.spec_id = data_file.spec_id
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=template.snapshot_id,
                    data_file=copy,
                )
            )
        manifest = writer.to_manifest_file()
    read_manifest(manifest, io, bounds=frozenset({key}))  # polars' and the decoder's first use
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        entries, raw = read_manifest(manifest, io, bounds=frozenset({key}))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert raw is not None and len(entries) == len(raw.data_files) == count
    assert all(isinstance(e.data_file, PartialDataFile) for e in entries)
    own = sum(
        len(e.data_file.file_path) + len(b) for e, b in zip(entries, raw.data_files, strict=True)
    )
    beyond = (held - own) / count
    assert beyond < 1_000, f"{beyond:.0f} bytes an entry beyond its path and bytes"


def test_a_planners_read_finds_the_keys_statistics_wherever_a_files_map_lists_them(h, tmp_path):
    """The planner reads the key's bounds and null count at the position the first file's map
    lists the key, and searches the files whose maps list it elsewhere or not at all: every
    planned statistic equals the whole read's."""
    from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus, write_manifest

    table = _table(h)
    io = table.io
    key = table.schema().find_field("id").field_id
    source = table.current_snapshot().manifests(io)[0]
    template = source.fetch_manifest_entry(io)[0]
    output = io.new_output(str(tmp_path / "orders.avro"))

    def reordered(stats: dict[int, Any], i: int) -> dict[int, Any]:
        items = list(stats.items())
        if i % 3 == 1:  # the key listed last
            items = [p for p in items if p[0] != key] + [p for p in items if p[0] == key]
        elif i % 3 == 2:  # no statistic of the key
            items = [p for p in items if p[0] != key]
        return dict(items)

    with write_manifest(
        2,
        table.spec(),
        table.schema(),
        output,
        snapshot_id=template.snapshot_id,
        avro_compression="deflate",
    ) as writer:
        for i in range(9):
            data_file = template.data_file
            fields = {name: getattr(data_file, name) for name in _FILE_FIELDS}
            fields["null_value_counts"] = reordered(dict(data_file.null_value_counts), i)
            copy = DataFile.from_args(
                **fields,
                file_path=f"{data_file.file_path}-{i}",
                lower_bounds=reordered({**data_file.lower_bounds, key: i.to_bytes(4, "little")}, i),
                upper_bounds=reordered(
                    {**data_file.upper_bounds, key: (i + 9).to_bytes(4, "little")}, i
                ),
            )
            copy.spec_id = data_file.spec_id
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=template.snapshot_id,
                    data_file=copy,
                )
            )
        manifest = writer.to_manifest_file()
    planned, _ = read_manifest(manifest, io, bounds=frozenset({key}))
    whole, _ = read_manifest(manifest, io)
    assert all(isinstance(e.data_file, PartialDataFile) for e in planned)
    assert len(planned) == len(whole) == 9
    for p, w in zip(planned, whole, strict=True):
        for name in ("lower_bounds", "upper_bounds", "null_value_counts"):
            assert getattr(p.data_file, name).get(key) == getattr(w.data_file, name).get(key)
    assert [p.data_file.lower_bounds.get(key) for p in planned][:3] == [
        (0).to_bytes(4, "little"),
        (1).to_bytes(4, "little"),
        None,
    ]
