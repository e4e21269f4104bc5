"""Manifest pruning by partition summaries (issue 18): on a table partitioned by a key column
whose manifests each cover a few partitions (a table another engine clustered, or one bigger than
the manifest target size), a keyed write reads only the manifests whose partition summaries can
hold its keys. The others are carried forward unread, and every write mode still matches the
polars oracle, run twice, with delete files in the skipped and in the read manifests."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from pyiceberg.avro.file import AvroFileHeader
from pyiceberg.manifest import ManifestContent

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.iceberg.snapshot import manifests
from pipeline_output.stores.iceberg.snapshot.manifests import read_index
from pipeline_output.stores.iceberg.write.key_scan import manifest_admission
from pipeline_output.stores.iceberg.write.merge import MIN_ROWS
from pipeline_output_tests.oracle import assert_same_multiset, expect

NS = "datasets"
REGIONS = [f"r{i}" for i in range(6)]
PER_REGION = 200


def _rows(region: str, ids: range, *, version: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {"region": [region] * len(ids), "id": list(ids), "v": [i * 10 + version for i in ids]},
        schema={"region": pl.String, "id": pl.Int64, "v": pl.Int64},
    )


def _clustered_table(store: IcebergStore, name: str) -> pl.DataFrame:
    """One region per append, manifest merging off: one data manifest per region. Region r2
    carries a positional delete file (its own delete manifest) from a merge-on-read upsert."""
    spec = DatasetSpec(
        name=name, primary_key=("region", "id"), strategy="append_always", partition_by=("region",)
    )
    store.write(spec, _rows(REGIONS[0], range(PER_REGION)))
    table = store.load(spec)
    assert table is not None
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "false"})
    for region in REGIONS[1:]:
        store.write(spec, _rows(region, range(PER_REGION)))
    mor = DatasetSpec(
        name=name,
        primary_key=("region", "id"),
        partition_by=("region",),
        write_strategy_hint="merge-on-read",
    )
    changed = _rows("r2", range(0, 10), version=1)
    result = store.write(mor, changed)
    assert result.files_merged_on_read == 1
    base = pl.concat([_rows(r, range(PER_REGION)) for r in REGIONS])
    return expect("snapshot_replace", base, changed, ["region", "id"]).table


def _spec(name: str, strategy: str, hint: str) -> DatasetSpec:
    return DatasetSpec(
        name=name,
        primary_key=("region", "id"),
        strategy=strategy,  # type: ignore[arg-type]
        partition_by=("region",),
        write_strategy_hint=hint,  # type: ignore[arg-type]
    )


@pytest.fixture
def store(catalog: Any, pg_db_url: str) -> IcebergStore:
    return IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))


def test_a_keyed_write_reads_only_the_manifests_whose_partitions_hold_its_keys(
    store: IcebergStore,
) -> None:
    _clustered_table(store, "clustered_plan")
    spec = _spec("clustered_plan", "snapshot_replace", "auto")
    table = store.load(spec)
    assert table is not None
    index = read_index(table)
    data_manifests = [m for m in index.manifests if m.content == ManifestContent.DATA]
    assert len(data_manifests) >= len(REGIONS)  # one per region at least (merging is off)

    batch = _rows("r4", range(5))
    admit = manifest_admission(table.metadata, spec, batch)
    assert admit is not None
    tasks = index.tasks(admit=admit)
    assert {t.file.partition[0] for t in tasks} == {"r4"}
    read = index.read_manifests()
    data_read = [m for m in read if m.content == ManifestContent.DATA]
    assert len(data_read) == 1 and len(read) < len(index.manifests) / 2
    # every delete manifest is read: each task carries all its delete files
    assert all(
        index.live.is_read(m.manifest_path) for m in index.manifests if m not in data_manifests
    )
    # the manifest list's counts give the table's live rows without reading the rest
    assert index.live_rows() == len(REGIONS) * PER_REGION == store.read(spec).height

    # a table not partitioned by a key column has nothing to prune by
    unkeyed = DatasetSpec(name="clustered_plan", primary_key=("id",), partition_by=("region",))
    assert manifest_admission(table.metadata, unkeyed, batch) is None


@pytest.mark.parametrize(
    ("strategy", "hint"),
    [
        ("snapshot_replace", "copy-on-write"),
        ("snapshot_replace", "merge-on-read"),
        ("append_new", "auto"),
        ("sync", "merge-on-read"),
    ],
)
def test_writes_into_a_table_with_clustered_manifests_match_the_oracle_twice(
    store: IcebergStore, strategy: str, hint: str
) -> None:
    name = f"clustered_{strategy}_{hint.replace('-', '_')}"
    before = _clustered_table(store, name)
    spec = _spec(name, strategy, hint)
    # r2 (with its delete file) and r4 change; a key of a new region arrives
    batch = pl.concat(
        [
            _rows("r2", range(5, 15), version=2),
            _rows("r4", range(190, 210), version=2),
            _rows("r9", range(3), version=2),
        ]
    )
    table = store.load(spec)
    assert table is not None
    untouched = {
        m.manifest_path
        for m in read_index(table).manifests
        if m.partitions and m.partitions[0].lower_bound in (b"r1", b"r3", b"r5")
    }
    expected = expect(strategy, before, batch, ["region", "id"])
    for rerun in range(2):
        result = store.write(spec, batch)
        assert_same_multiset(store.read(spec), expected.table)
        assert result.rows_total_after == expected.table.height
        if not rerun:
            for key, value in expected.counters.items():
                assert getattr(result, key) == value, (key, getattr(result, key), value)
    table = store.load(spec)
    assert table is not None
    kept = {m.manifest_path for m in read_index(table).manifests}
    if strategy != "sync":  # sync reads every file (absent keys anywhere are deleted)
        assert untouched and untouched <= kept  # carried forward as they were
    # another reader sees the same rows
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected.table)  # type: ignore[arg-type]


def test_a_manifest_admitted_for_one_partition_keeps_the_deletes_of_its_other_partitions(
    store: IcebergStore,
) -> None:
    """One manifest holds r0's and r1's files; r1's file has a delete file in a delete manifest
    of r1 alone. A merge-on-read upsert into r0 reads that manifest (for r0) and folds the
    smallest untouched small file without delete files into its new file: r1's file must come
    with its deletes (and so stay), or the rows they delete come back."""
    name = "mixed_manifest"
    spec = _spec(name, "snapshot_replace", "merge-on-read")
    # r0's file is not small (merge_policy.MIN_ROWS): only r1's can be folded into a new file
    both = pl.concat([_rows("r0", range(MIN_ROWS)), _rows("r1", range(40))])
    store.write(spec, both)  # one manifest, two partitions
    table = store.load(spec)
    assert table is not None
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "false"})
    changed_r1 = _rows("r1", range(5), version=1)
    assert store.write(spec, changed_r1).files_merged_on_read == 1
    expected = expect("snapshot_replace", both, changed_r1, ["region", "id"]).table
    batch = _rows("r0", range(10), version=2)
    expected = expect("snapshot_replace", expected, batch, ["region", "id"])
    for rerun in range(2):
        result = store.write(spec, batch)
        assert_same_multiset(store.read(spec), expected.table)
        if not rerun:
            assert result.files_merged_on_read == 1
            for key, value in expected.counters.items():
                assert getattr(result, key) == value, (key, getattr(result, key), value)
    table = store.load(spec)
    assert table is not None
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected.table)  # type: ignore[arg-type]


def test_a_process_reads_each_manifest_once_across_its_writes(
    store: IcebergStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest file (and a manifest list) is never rewritten in place: what the process read
    of it is reused by its later writes, which read only the manifests written since — and of
    those not the ones its own commit encoded, nor that commit's manifest list: the commit kept
    them as written (and the table still matches the oracle)."""
    before = _clustered_table(store, "clustered_reread")
    spec = _spec("clustered_reread", "snapshot_replace", "copy-on-write")
    reads = _counted_manifest_reads(monkeypatch)
    lists = _counted(monkeypatch, manifests, "manifest_list", lambda io, s: s.manifest_list)
    manifests.READ_MANIFESTS.clear()
    table = store.load(spec)
    assert table is not None
    every = {m.manifest_path for m in read_index(table).manifests}
    planned = len(read_index(table).tasks())
    assert sorted(reads) == sorted(every)
    reads.clear()
    assert len(read_index(table).tasks()) == planned and reads == []  # none read again
    assert len(lists) == 1  # nor the manifest list

    batch = _rows("r4", range(190, 210), version=2)
    expected = expect("snapshot_replace", before, batch, ["region", "id"]).table
    store.write(spec, batch)
    assert reads == []  # the write planned from the manifests read before
    table = store.load(spec)
    assert table is not None
    written = [m for m in read_index(table).manifests if m.manifest_path not in every]
    read_index(table).tasks()
    # of what the commit wrote nothing is read: the manifest it encoded (the write's added
    # entries) and its list were kept, and the one it copied from the old ones' bytes holds the
    # removed entries only (DELETED: its list entry says it holds no live file)
    assert reads == []
    assert [m.deleted_files_count > 0 for m in written if not m.added_files_count] == [True]
    assert len(lists) == 1
    assert_same_multiset(store.read(spec), expected)
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected)  # type: ignore[arg-type]


def test_the_manifests_a_process_keeps_stay_within_their_byte_budget(
    store: IcebergStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept manifests are bounded by their Avro bytes, whatever their entries' width: the least
    recently read go first, and one over a quarter of the budget is never kept."""
    _clustered_table(store, "clustered_budget")
    table = store.load(DatasetSpec(name="clustered_budget", primary_key=("region", "id")))
    assert table is not None
    every = read_index(table).manifests
    sizes = [m.manifest_length for m in every]
    reads = _counted_manifest_reads(monkeypatch)
    kept = manifests.ReadManifests(max_bytes=4 * max(sizes))  # none over a quarter
    for manifest in every:
        kept.read(manifest, table.io)
    fits = 0  # the newest manifests whose bytes fit the budget together
    while fits < len(every) and sum(sizes[len(every) - fits - 1 :]) <= kept.max_bytes:
        fits += 1
    assert 4 <= fits < len(every)  # some kept, some dropped
    assert kept.kept_bytes == sum(sizes[len(every) - fits :]) <= kept.max_bytes
    reads.clear()
    for manifest in every[len(every) - fits :]:
        kept.read(manifest, table.io)  # kept: not read again
    assert reads == []
    kept.read(every[0], table.io)  # the least recently read was dropped: read again
    assert reads == [every[0].manifest_path]
    small = manifests.ReadManifests(max_bytes=4 * max(sizes) - 4)  # the largest: over a quarter
    small.read(every[sizes.index(max(sizes))], table.io)
    assert small.kept_bytes == 0


def test_planning_reads_no_manifest_of_deleted_entries_only_and_resolves_each_schema_once(
    store: IcebergStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot that removes files lists a manifest of DELETED entries: its list entry says it
    holds no live file, so planning never reads it. The manifests read share one Avro schema:
    its reader is resolved once (pyiceberg resolves one per file), and the plan is pyiceberg's."""
    before = _clustered_table(store, "clustered_deleted_only")
    spec = _spec("clustered_deleted_only", "snapshot_replace", "copy-on-write")
    batch = _rows("r4", range(190, 210), version=2)
    expected = expect("snapshot_replace", before, batch, ["region", "id"]).table
    for _ in range(2):
        store.write(spec, batch)
        assert_same_multiset(store.read(spec), expected)
    table = store.load(spec)
    assert table is not None
    listed = read_index(table).manifests
    removed = [m for m in listed if m.added_files_count == 0 and m.existing_files_count == 0]
    assert removed and all(m.deleted_files_count for m in removed)
    manifests.READ_MANIFESTS.clear()
    reads = _counted_manifest_reads(monkeypatch)
    schemas = _counted(monkeypatch, AvroFileHeader, "get_schema", lambda header: "")
    tasks = read_index(table).tasks()
    assert reads and not {m.manifest_path for m in removed} & set(reads)
    assert len(reads) >= 3 and len(schemas) <= 1
    assert sorted(t.file.file_path for t in tasks) == sorted(
        t.file.file_path for t in table.scan().plan_files()
    )


def _counted_manifest_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the manifests decoded from now on, in order (a cache hit decodes none)."""
    return _counted(monkeypatch, manifests, "read_manifest", lambda m, io: m.manifest_path)


def _counted(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, path: Any) -> list[str]:
    """`owner.name(*args)` wrapped: the `path(*args)` of each call, in order."""
    calls: list[str] = []
    real = getattr(owner, name)

    def counted(*args: Any, **options: Any) -> Any:
        calls.append(path(*args))
        return real(*args, **options)

    monkeypatch.setattr(owner, name, counted)
    return calls
