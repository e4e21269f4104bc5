"""Which files a compaction rewrites, and into which output files: the bin-packing plan.

Owns the rule (Spark's `rewrite_data_files` bin-pack, simplified), decided on one snapshot's
`ManifestIndex` without reading any data:

- files are grouped by partition (partition spec and partition value): a bin never mixes
  partitions;
- a file is a candidate when it is *small* (below `SMALL_FRACTION` of the target file size) or has
  positional delete files (whatever its size: rewriting it folds the deletes in);
- a partition is rewritten when it has at least `min_input_files` candidates, or its candidates
  add up to more than the target size, or one of them has delete files;
- its candidates, ordered by the lower bound of the first sort column (adjacent key ranges end up
  in the same output file), are packed greedily into bins of at most the target size; each bin
  becomes one output file (sorted by the table's sort order, `sort_keys`). A bin of one file
  without deletes would only copy it, and is dropped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, cast

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import NullOrder, SortDirection
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, LongType, PrimitiveType

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.snapshot.manifests import ManifestIndex
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    entry_contents,
    entry_files,
    file_partitions,
    file_paths,
    file_rows,
    file_sizes,
    file_spec_ids,
    file_statistics,
    partition_values,
)

DEFAULT_MIN_INPUT_FILES = 5
SMALL_FRACTION = 0.75  # Spark's default min-file-size-bytes: 75 % of the target


def _distinct_paths(files: Iterable[DataFile]) -> list[DataFile]:
    """`files` without repeats (by path), in the order first seen."""
    seen: dict[str, DataFile] = {}
    for f in files:
        seen.setdefault(f.file_path, f)
    return list(seen.values())


@dataclass(frozen=True)
class Bin:
    """Input data files (with their delete files) that become one output file.

    The files as the plan's columns hold them: no scan task per file unless a read asks for
    them (`tasks`: polars' Iceberg scan of files with deletes); a plan of 20,000 files made and
    freed 40,000 objects for a stream that reads only their paths."""

    spec_id: int
    partition: Record | None
    files: tuple[DataFile, ...]
    # each file's positional delete files, in the order of `files`; None: no file has any
    deletes: tuple[set[DataFile], ...] | None = None

    @cached_property
    def paths(self) -> list[str]:
        return file_paths(self.files)

    @cached_property
    def tasks(self) -> tuple[FileScanTask, ...]:
        """A scan task per file, with its delete files."""
        if self.deletes is None:
            return tuple(map(FileScanTask, self.files))
        return tuple(
            FileScanTask(f, delete_files=d) for f, d in zip(self.files, self.deletes, strict=True)
        )

    @cached_property
    def bytes(self) -> int:
        return sum(file_sizes(self.files))

    @cached_property
    def records(self) -> int:
        """Rows stored in the input files (before their deletes are applied)."""
        return sum(file_rows(self.files))

    @property
    def with_deletes(self) -> bool:
        """Whether a file of the bin has delete files."""
        return self.deletes is not None and any(self.deletes)

    @property
    def delete_files(self) -> list[DataFile]:
        return _distinct_paths(d for ds in self.deletes or () for d in ds)


@dataclass(frozen=True)
class CompactionPlan:
    """The bins of one snapshot (empty: nothing worth rewriting)."""

    snapshot_id: int | None
    target_bytes: int
    bins: list[Bin] = field(default_factory=list)
    data_files: int = 0  # live data files of the snapshot
    # their paths, when a bin carries delete files (what the commit checks those against;
    # 20,000 paths' set is ~2 MB)
    live_paths: frozenset[str] = frozenset()

    @cached_property
    def input_files(self) -> list[DataFile]:
        """The bins' input files, in order (made once: a compaction counts, removes and
        reports 20,000)."""
        return [f for b in self.bins for f in b.files]

    @property
    def delete_files(self) -> list[DataFile]:
        """Every delete file applying to an input (removable only if it applies to no other)."""
        return _distinct_paths(d for b in self.bins for d in b.delete_files)

    @property
    def input_bytes(self) -> int:
        return sum(b.bytes for b in self.bins)


def planned_files(index: ManifestIndex) -> tuple[list[DataFile], list[set[DataFile]] | None]:
    """Every live data file of the index's snapshot, with the positional delete files that
    apply to each — None when the snapshot has no delete file (`ManifestIndex.tasks`'s files
    and delete files, without a scan task per file when there are none: 20,000 of them took
    ~8 ms to make and more to free, for a plan that reads the files' columns)."""
    index.live.load(index.manifests)
    read = [index.live[m.manifest_path] for m in index.manifests]
    if all(entry_contents(entries) <= _DATA_ONLY for entries in read):
        return entry_files(chain.from_iterable(read)), None
    tasks = index.tasks()  # (delete files matched to data files; equality deletes refused)
    return list(map(_TASK_FILE, tasks)), list(map(_TASK_DELETES, tasks))


def plan_bins(
    files: Sequence[DataFile],
    *,
    deletes: Sequence[set[DataFile]] | None,
    live: Sequence[DataFile],
    schema: Schema,
    sort_columns: tuple[str, ...],
    target_bytes: int,
    min_input_files: int,
    snapshot_id: int | None,
) -> CompactionPlan:
    """Bin-pack `files` (the data files that may be rewritten, with `deletes`: each one's
    positional delete files, None when none has any; `live`: every live data file of the
    snapshot) as the module docstring says.

    The files' sizes, partitions, spec ids, paths and first sort key's lower bounds are taken
    as columns (`manifest_decoding`'s C-level getters), the candidates grouped by partition
    record first (a planner's files share one record per partition and manifest) then by its
    values: the Python per file is one loop of no call (a compaction plans 20,000)."""
    small = int(target_bytes * SMALL_FRACTION)
    files = list(files)
    sizes = file_sizes(files)
    partitions = file_partitions(files)
    flags = list(map(bool, deletes)) if deletes is not None else [False] * len(files)
    spec_ids = file_spec_ids(files)
    groups = _one_partition(spec_ids, partitions, sizes, flags, small)
    if groups is None:
        by_record: dict[tuple[int, int], list[int]] = {}
        for at, (spec_id, partition, size, with_deletes) in enumerate(
            zip(spec_ids, partitions, sizes, flags, strict=True)
        ):
            if with_deletes or size < small:
                by_record.setdefault((spec_id, id(partition)), []).append(at)
        groups = {}
        for (spec_id, _), members in by_record.items():
            key = (spec_id, _partition_key(partitions[members[0]]))
            groups.setdefault(key, []).extend(members)
    keys = _sort_keys(schema, sort_columns, files)
    bins: list[Bin] = []

    def bin_of(spec_id: int, partition: Record, members: list[int]) -> Bin:
        return Bin(
            spec_id,
            partition,
            tuple(map(files.__getitem__, members)),
            None if deletes is None else tuple(map(deletes.__getitem__, members)),
        )

    for (spec_id, _), candidates in groups.items():
        partition = partitions[candidates[0]]
        with_deletes = any(flags[at] for at in candidates)
        total = sum(sizes[at] for at in candidates)
        if len(candidates) < min_input_files and total <= target_bytes and not with_deletes:
            continue
        candidates.sort(key=keys.__getitem__)
        if total <= target_bytes:  # one bin of them all (the packing below would close none)
            bins.append(bin_of(spec_id, partition, candidates))
            continue
        current: list[int] = []
        size = 0
        for at in candidates:
            if current and size + sizes[at] > target_bytes:
                bins.append(bin_of(spec_id, partition, current))
                current, size = [], 0
            current.append(at)
            size += sizes[at]
        if current:
            bins.append(bin_of(spec_id, partition, current))
    bins = [b for b in bins if len(b.files) > 1 or b.with_deletes]
    carried = any(b.with_deletes for b in bins)
    return CompactionPlan(
        snapshot_id=snapshot_id,
        target_bytes=target_bytes,
        bins=bins,
        data_files=len(live),
        live_paths=frozenset(file_paths(live)) if carried else frozenset(),
    )


_DATA_ONLY = frozenset((int(DataFileContent.DATA),))
_TASK_FILE, _TASK_DELETES = attrgetter("file"), attrgetter("delete_files")
_ONE_GROUP_RECORDS = 64  # distinct partition records `_one_partition` compares


def _one_partition(
    spec_ids: list[int],
    partitions: list[Record],
    sizes: list[int],
    deletes: list[bool],
    small: int,
) -> dict[tuple[int, Any], list[int]] | None:
    """The candidates grouped by partition when every file is one (small, no delete files) of
    one spec and partition (an unpartitioned table's: a planner's files share one record per
    manifest, compared once each): one group of them all, by C-level calls; else None."""
    if not sizes or any(deletes) or max(sizes) >= small or len(set(spec_ids)) != 1:
        return None
    records = dict(zip(map(id, partitions), partitions, strict=True))
    if len(records) > _ONE_GROUP_RECORDS:
        return None
    values = {_partition_key(record) for record in records.values()}
    if len(values) != 1:
        return None
    return {(spec_ids[0], values.pop()): list(range(len(sizes)))}


def _sort_keys(schema: Schema, sort_columns: tuple[str, ...], files: list[DataFile]) -> list[Any]:
    """Each file's place in its bins' order: (no bound?, the lower bound of the first sort
    column, its path) — integer bounds of the usual width unpacked by C calls for all files at
    once (the bounds alone when no two are alike: the same order), any other one by one
    (`_lower_bound_of`)."""
    field_ = next((schema.find_field(c) for c in sort_columns[:1] if c in _names(schema)), None)
    if field_ is not None and isinstance(field_.field_type, PrimitiveType):
        fast = _UNPACK.get(type(field_.field_type))
        lowers = file_statistics(files, "lower_bounds", field_.field_id)
        if fast is not None and None not in lowers and set(map(len, lowers)) == {fast.size}:
            values = unpacked_integers(cast(list[bytes], lowers))
            if values is not None and len(set(values)) == len(values):
                return values  # (no two alike: ordered by them alone, as by the tuples)
            if values is not None:
                return list(zip(repeat(False), values, file_paths(files)))
    order = _lower_bound_of(schema, sort_columns)
    return [(*order(f), path) for f, path in zip(files, file_paths(files), strict=True)]


def _partition_key(partition: Record) -> Any:
    """A partition's values as a tuple (pyiceberg's `Record` hashes its printed form: a
    `repr` per file), or the record itself when a value is not hashable."""
    values = partition_values(partition)
    try:
        hash(values)
    except TypeError:
        return partition
    return values


def sort_keys(metadata: TableMetadata, spec: DatasetSpec) -> list[tuple[str, bool, bool]]:
    """(column, descending, nulls last) of the table's sort order, else the spec's sort columns."""
    schema = metadata.schema()
    names = {f.name for f in schema.fields}
    keys = []
    for sf in metadata.sort_order().fields:
        if str(sf.transform) != "identity":
            continue
        name = schema.find_field(sf.source_id).name
        keys.append(
            (name, sf.direction == SortDirection.DESC, sf.null_order == NullOrder.NULLS_LAST)
        )
    if keys:
        return keys
    return [(c, False, False) for c in spec.sort_columns if c in names]


def _lower_bound_of(schema: Schema, sort_columns: tuple[str, ...]) -> Any:
    """A sort key per data file: (no bound?, lower bound of the first sort column)."""
    field_ = next((schema.find_field(c) for c in sort_columns[:1] if c in _names(schema)), None)
    if field_ is None or not isinstance(field_.field_type, PrimitiveType):
        return lambda _file: (True, 0)
    field_id, field_type = field_.field_id, field_.field_type
    fast = _UNPACK.get(type(field_type))  # (pyiceberg's `from_bytes` of those, sans dispatch)

    def key(data_file: DataFile) -> tuple[bool, Any]:
        raw = (data_file.lower_bounds or {}).get(field_id)
        if raw is None:
            return (True, 0)
        try:
            if fast is not None and len(raw) == fast.size:
                return (False, fast.unpack(raw)[0])
            return (False, from_bytes(field_type, raw))
        except (ValueError, TypeError):  # a bound we cannot decode orders last
            return (True, 0)

    return key


_UNPACK = {IntegerType: struct.Struct("<i"), LongType: struct.Struct("<q")}
_WIDTHS = {4: "i", 8: "q"}


def unpacked_integers(bounds: list[bytes]) -> list[int] | None:
    """Integer bounds (Iceberg's single-value serialization: little-endian, signed) of one
    width, 4 or 8 bytes, unpacked by one C call for all of them; None for other widths or
    mixed ones (the caller decodes each)."""
    widths = set(map(len, bounds))
    if len(widths) != 1 or (width := widths.pop()) not in _WIDTHS:
        return None
    return list(struct.unpack(f"<{len(bounds)}{_WIDTHS[width]}", b"".join(bounds)))


def _names(schema: Schema) -> set[str]:
    return {f.name for f in schema.fields}
