"""A commit's new data manifest and its manifest list, encoded from their records' values.

A commit that removes files writes its ADDED entries' manifest under the Avro layout of a data
manifest it removes files from (when that manifest's metadata is what pyiceberg's writer would
write: the same table schema, spec, format version and codec) and a v2 manifest list under the v2
schema, each record encoded from its values (`manifest_encoding.added_manifest`,
`manifest_list_v2`), not through pyiceberg's writers. What they write reads back as what
pyiceberg's writers write from the same records — the same entries and manifest records, the same
Avro metadata —; a history through both paths (the fallback where the layout's metadata differs:
after the schema evolved) reads the same at every snapshot in pyiceberg and DuckDB.
"""

from __future__ import annotations

import json
from copy import copy
from typing import Any

import fastavro
import polars as pl
import pytest
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    read_manifest_list,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from pipeline_output import DatasetSpec
from pipeline_output.stores.iceberg.table.manifest_decoding import read_manifest
from pipeline_output.stores.iceberg.table.manifest_encoding import (
    MANIFEST_LIST_V2_SCHEMA,
    added_manifest,
    manifest_list_v2,
)
from pipeline_output_tests.iceberg_harness import Harness, duckdb_with_iceberg
from pipeline_output_tests.oracle import assert_same_multiset

LAYOUTS = {"unpartitioned": (), "region": ("region",), "bucket": ("bucket(4, id)",)}


def frame(ids: range, version: int, *, extra: bool = False) -> pl.DataFrame:
    rows = list(ids)
    out = pl.DataFrame(
        {
            "id": pl.Series(rows, dtype=pl.Int64),
            "v": pl.Series([version] * len(rows), dtype=pl.Int64),
            "region": [f"r{i % 3}" for i in rows],
            "amount": pl.Series([i * 0.5 + version for i in rows], dtype=pl.Float64),
        }
    )
    return out.with_columns(note=pl.lit(f"n{version}")) if extra else out


def _spec(layout: str) -> DatasetSpec:
    return DatasetSpec(
        name=f"encoded_{layout}",
        primary_key=("id",),
        strategy="snapshot_replace",
        write_strategy_hint="copy-on-write",
        partition_by=LAYOUTS[layout],
    )


def _header(io: Any, path: str) -> dict[str, str]:
    with io.new_input(path).open() as stream:
        return dict(fastavro.reader(stream).metadata)


def _entry_values(entry: ManifestEntry) -> tuple[Any, ...]:
    f = entry.data_file
    return (
        entry.status,
        entry.snapshot_id,
        entry.sequence_number,
        entry.file_sequence_number,
        *(f[n] for n in range(len(f))),
    )


def _manifest_values(manifest: ManifestFile) -> tuple[Any, ...]:
    return tuple(manifest[n] for n in range(len(manifest)) if n not in (0, 1))  # path, length


def test_manifest_list_schema_is_pyiceberg_s_v2_conversion():
    from pyiceberg.manifest import MANIFEST_LIST_FILE_SCHEMAS

    converted = AvroSchemaConversion().iceberg_to_avro(
        MANIFEST_LIST_FILE_SCHEMAS[2], schema_name="manifest_file"
    )
    assert json.dumps(converted) == MANIFEST_LIST_V2_SCHEMA


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_added_manifest_and_manifest_list_read_back_as_pyiceberg_s_writers_write_them(
    h: Harness, layout: str
):
    spec = _spec(layout)
    h.store().write(spec, frame(range(0, 30), 0))
    h.store().write(spec, frame(range(20, 40), 1))  # copy-on-write: files removed and added
    table = h.table(spec)
    snapshot = table.current_snapshot()
    io, sid = table.io, snapshot.snapshot_id
    listed = snapshot.manifests(io)
    mine = [m for m in listed if m.added_snapshot_id == sid and m.added_files_count]
    assert len(mine) == 1
    added = [
        ManifestEntry.from_args(
            status=ManifestEntryStatus.ADDED,
            snapshot_id=sid,
            sequence_number=None,
            file_sequence_number=None,
            data_file=e.data_file,
        )
        for e in mine[0].fetch_manifest_entry(io, discard_deleted=False)
    ]
    assert added and all(e.data_file.lower_bounds for e in added)
    _, raw = read_manifest(mine[0], io)
    assert raw is not None
    tx_spec, schema = table.specs()[mine[0].partition_spec_id], table.schema()
    base = f"{table.location()}/metadata/test-{layout}"

    # the data manifest: encoded from values, and by pyiceberg's writer
    paths: list[str] = []

    def output() -> Any:
        paths.append(f"{base}-encoded-m0.avro")
        return io.new_output(paths[-1])

    encoded = added_manifest(output, raw, added, spec=tx_spec, schema=schema, snapshot_id=sid)
    assert encoded is not None and paths == [encoded.manifest_path]
    with write_manifest(
        format_version=2,
        spec=tx_spec,
        schema=schema,
        output_file=io.new_output(f"{base}-pyiceberg-m0.avro"),
        snapshot_id=sid,
        avro_compression="gzip",
    ) as writer:
        for entry in added:
            writer.add_entry(entry)
    theirs = writer.to_manifest_file()
    assert _manifest_values(encoded) == _manifest_values(theirs)
    assert _header(io, encoded.manifest_path) == _header(io, theirs.manifest_path)
    for manifest in (encoded, theirs):
        manifest.sequence_number = snapshot.sequence_number  # (inherited on read)
    read = [
        [_entry_values(e) for e in m.fetch_manifest_entry(io, discard_deleted=False)]
        for m in (encoded, theirs)
    ]
    assert read[0] == read[1] == [_entry_values(e) for e in mine[0].fetch_manifest_entry(io)]

    # the manifest list: the snapshot's manifests, its own ones' sequence numbers unassigned
    unassigned = []
    for manifest in listed:
        if manifest.added_snapshot_id == sid:
            manifest = copy(manifest)
            manifest.sequence_number = manifest.min_sequence_number = UNASSIGNED_SEQ
        unassigned.append(manifest)
    lists = [f"{base}-encoded-snap.avro", f"{base}-pyiceberg-snap.avro"]
    options = {
        "snapshot_id": sid,
        "parent_snapshot_id": snapshot.parent_snapshot_id,
        "sequence_number": snapshot.sequence_number,
    }
    assert manifest_list_v2(io.new_output(lists[0]), unassigned, codec="deflate", **options)
    with write_manifest_list(
        format_version=2, output_file=io.new_output(lists[1]), avro_compression="gzip", **options
    ) as list_writer:
        list_writer.add_manifests(unassigned)
    read_lists = [
        [tuple(m[n] for n in range(len(m))) for m in read_manifest_list(io.new_input(p))]
        for p in lists
    ]
    committed = [tuple(m[n] for n in range(len(m))) for m in listed]
    assert read_lists[0] == read_lists[1] == committed
    assert _header(io, lists[0]) == _header(io, lists[1])


def test_added_manifest_refuses_entries_it_does_not_write_as_added(h: Harness):
    spec = _spec("region")
    h.store().write(spec, frame(range(0, 10), 0))
    table = h.table(spec)
    (manifest,) = table.current_snapshot().manifests(table.io)
    entries = manifest.fetch_manifest_entry(table.io)  # read back: sequence numbers inherited
    _, raw = read_manifest(manifest, table.io)
    assert raw is not None

    def output() -> Any:
        raise AssertionError("no output taken for entries it refuses")

    sid = table.current_snapshot().snapshot_id
    options = {"spec": table.spec(), "schema": table.schema(), "snapshot_id": sid}
    assert added_manifest(output, raw, entries, **options) is None


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_history_through_both_paths_reads_the_same_at_every_snapshot(
    h: Harness, layout: str, monkeypatch: pytest.MonkeyPatch
):
    """Copy-on-write upserts (encoded manifests), then a new column (the layout's metadata
    differs from what the writer writes: pyiceberg's writer), then upserts again."""
    from pipeline_output.stores.iceberg.snapshot import commit

    taken: list[bool] = []
    encode = commit.added_manifest

    def spy(*args: Any, **options: Any) -> ManifestFile | None:
        written = encode(*args, **options)
        taken.append(written is not None)
        return written

    monkeypatch.setattr(commit, "added_manifest", spy)
    fallbacks: list[int] = []
    pyiceberg_writer = commit.IndexedOverwrite._writer

    def writer(self: Any, content: Any, spec_id: int) -> Any:
        fallbacks.append(spec_id)
        return pyiceberg_writer(self, content, spec_id)

    monkeypatch.setattr(commit.IndexedOverwrite, "_writer", writer)
    spec = _spec(layout)
    reads: dict[int, pl.DataFrame] = {}
    for n in range(5):
        h.store().write(spec, frame(range(n * 10, n * 10 + 15), n, extra=n >= 3))
        table = h.table(spec)
        reads[table.current_snapshot().snapshot_id] = h.store().read(spec.name)
    assert True in taken  # encoded from values
    assert fallbacks  # the write after the new column: pyiceberg's writer
    table = h.table(spec)
    con = duckdb_with_iceberg()
    try:
        for snapshot_id, want in reads.items():
            scanned = pl.from_arrow(table.scan(snapshot_id=snapshot_id).to_arrow())
            assert isinstance(scanned, pl.DataFrame)
            assert_same_multiset(scanned, want)
            got = con.execute(
                "SELECT * FROM iceberg_scan(?, snapshot_from_id = ?)",
                [table.metadata_location, snapshot_id],
            ).pl()
            assert_same_multiset(got, want)
    finally:
        con.close()
