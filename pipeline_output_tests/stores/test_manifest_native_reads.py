"""A write's manifest reads without pyiceberg's reader tree (`table/manifest_decoding.py`).

The manifest list is decoded by fastavro, the manifests of the standard v2 layout field by field
on pyiceberg's C decoder: neither converts the file's Avro schema nor resolves pyiceberg's
reader against it (~1 ms each in a fresh process). What they give is what pyiceberg's reader
gives, entry for entry and field for field — on a partitioned table (bucket and date values)
carrying positional delete files, with ADDED, EXISTING and DELETED entries — and the entries'
own bytes; a layout the decoder does not know (a partition value of another type) is decoded by
pyiceberg's reader. A plan's few small local manifests are read on the planning thread.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import polars as pl
import pytest
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

from pipeline_output import DatasetSpec
from pipeline_output.stores.iceberg.snapshot import manifests
from pipeline_output.stores.iceberg.snapshot.manifests import READ_MANIFESTS, read_index
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    ResolvedAvroFile,
    manifest_list,
    read_manifest,
)
from pipeline_output.stores.iceberg.table.manifest_encoding import rewrite_manifest
from pipeline_output_tests.iceberg_harness import DATA_FILE_FIELDS, base, customers


def _entry(entry: Any) -> tuple[Any, ...]:
    """Everything a read gives of an entry, maps as dicts, each value with its type."""
    data_file = entry.data_file
    values = [getattr(data_file, name) for name in DATA_FILE_FIELDS]
    values = [dict(v) if hasattr(v, "items") else v for v in values]
    values.append(tuple(data_file.partition))
    head = (entry.status, entry.snapshot_id, entry.sequence_number, entry.file_sequence_number)
    return (*head, *values, tuple(type(v).__name__ for v in (*head, *values)))


def _file(entry: Any) -> tuple[Any, ...]:
    """`_entry`'s data file part (a rewritten entry's status and snapshot are its own)."""
    return _entry(entry)[4:-1]


def _resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each file opened by pyiceberg's reader from now on (`ResolvedAvroFile`: its schema
    converted and its reader resolved, or found resolved)."""
    calls: list[str] = []
    real = ResolvedAvroFile.__enter__

    def counted(self: ResolvedAvroFile) -> ResolvedAvroFile:
        calls.append(self.input_file.location)
        return real(self)

    monkeypatch.setattr(ResolvedAvroFile, "__enter__", counted)
    return calls


def _read_back(table: Any, manifest: Any, entries: list[Any], raw: Any) -> list[Any]:
    """The entries as a manifest rewritten from their bytes reads them back (pyiceberg's)."""
    output = table.io.new_output(manifest.manifest_path.replace(".avro", "-copy.avro"))
    written = rewrite_manifest(
        output,
        [(raw, list(zip(entries, raw.data_files, strict=True)))],
        spec=table.specs()[manifest.partition_spec_id],
        schema=table.schema(),
        snapshot_id=42,
        content=manifest.content,
    )
    assert written is not None
    return list(written.fetch_manifest_entry(table.io, discard_deleted=False))


def _table_with_deletes(h: Any) -> Any:
    """A table partitioned by a bucket of the key and the date, whose snapshots added files,
    carried some forward, removed others and wrote positional delete files."""
    spec = DatasetSpec(
        name="native_reads",
        primary_key=("id",),
        strategy="snapshot_replace",
        partition_by=("bucket(2, id)", "day"),
    )
    spec = dataclasses.replace(spec, write_strategy_hint="merge-on-read")  # type: ignore[arg-type]
    h.store().write(spec, base())
    changed = customers(range(1, 4), version=9)
    h.store().write(spec, pl.concat([changed, base().filter(pl.col("id") > 5)]))
    h.store().write(spec, pl.concat([changed, base().filter(pl.col("id") > 8)]))
    return h.table(spec)


def test_manifests_read_entry_for_entry_as_pyiceberg_reads_them_without_its_reader(
    h: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table_with_deletes(h)
    io = table.io
    listed = table.current_snapshot().manifests(io)
    contents = {m.content for m in listed}
    assert contents == {ManifestContent.DATA, ManifestContent.DELETES}
    statuses: set[Any] = set()
    kinds: set[Any] = set()
    for manifest in listed:
        resolved = _resolutions(monkeypatch)
        entries, raw = read_manifest(manifest, io)
        assert resolved == []
        monkeypatch.undo()
        pyiceberg = manifest.fetch_manifest_entry(io, discard_deleted=True)
        assert [_entry(e) for e in entries] == [_entry(e) for e in pyiceberg]
        assert raw is not None and len(raw.data_files) == len(entries)
        if entries:  # (a manifest of DELETED entries only gives none)
            back = _read_back(table, manifest, entries, raw)
            assert {e.status for e in back} == {ManifestEntryStatus.EXISTING}
            assert [_file(e) for e in back] == [_file(e) for e in pyiceberg]
        every = manifest.fetch_manifest_entry(io, discard_deleted=False)
        statuses |= {e.status for e in every}
        kinds |= {e.data_file.content for e in entries}
    assert statuses == set(ManifestEntryStatus)
    assert kinds == {DataFileContent.DATA, DataFileContent.POSITION_DELETES}


def test_a_manifest_list_is_read_as_pyiceberg_reads_it_without_its_reader(
    h: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table_with_deletes(h)
    resolved = _resolutions(monkeypatch)
    for snapshot in table.snapshots():
        read = manifest_list(table.io, snapshot)
        assert [m._data for m in read] == [m._data for m in snapshot.manifests(table.io)]
    assert resolved == []


def test_a_partition_value_of_another_type_is_decoded_by_pyiceberg(
    h: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest whose partition holds a double: pyiceberg's reader decodes it, the same."""
    spec = DatasetSpec(
        name="double_partition",
        primary_key=("id",),
        strategy="append_always",
        partition_by=("amount",),
    )
    h.store().write(spec, customers(range(1, 6)))
    table = h.table(spec)
    (manifest,) = table.current_snapshot().manifests(table.io)
    resolved = _resolutions(monkeypatch)
    entries, raw = read_manifest(manifest, table.io)
    assert resolved
    pyiceberg = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    assert [_entry(e) for e in entries] == [_entry(e) for e in pyiceberg]
    assert raw is not None and len(raw.data_files) == len(entries) == 5


def test_a_plans_few_small_local_manifests_are_read_on_the_planning_thread(
    h: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reader pool (its threads' start and hand-offs) for a plan of two 10 KB manifests:
    their decode holds the GIL either way."""
    table = _table_with_deletes(h)
    threads: list[threading.Thread] = []
    real = manifests.read_manifest

    def spy(*args: Any, **options: Any) -> Any:
        threads.append(threading.current_thread())
        return real(*args, **options)

    monkeypatch.setattr(manifests, "read_manifest", spy)
    READ_MANIFESTS.clear()
    index = read_index(table)
    tasks = index.tasks()
    assert len(threads) > 1
    assert set(threads) == {threading.current_thread()}
    assert sorted(t.file.file_path for t in tasks) == sorted(
        t.file.file_path for t in table.scan().plan_files()
    )
    assert sum(len(t.delete_files) for t in tasks) > 0
