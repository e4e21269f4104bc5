"""One vectorised pass over a merge's candidate files: which of their live rows the compute's keys
match (a sync: which it leaves out), and which matched rows really change.

Owns `scan_candidates`. The candidate data files are read as ONE polars multi-file Parquet scan
(no collect per file): only the key columns (and those of a sync's window or partition slice),
every row numbered by its place in the concatenation of the files (`G`), which with the files' record counts gives its file
and its physical position (the positions a merge-on-read delete file holds). The rows the files'
positional delete files remove (read the same way, one scan) are left out, and the rest is joined
with the compute's keys on the fly (polars' streaming engine: memory follows the batch and the
matches, not the files). Files that are not local (an object store) are read through the table's
own FileIO instead (`ObjectFiles`: each footer fetched once per write, only the columns a pass
asks for, files in parallel), into the same frames.

Telling changed matched rows from unchanged ones needs their values, and reading every column of
every touched file is what made a spread upsert cost ~10x its floor. Rows are compared column by
column instead, cheapest column first (by the files' `column_sizes`), each column by the one
definition of a changed value (`frame_rows.values_differ`): a row that differs in one
column is changed and not looked at again, so an upsert that changes a small column of every
matched row (a status, a timestamp, a version) reads that column and stops; only rows equal in
every column so far are read on. Columns are gathered at the matched positions only.

Whether the key scan may run is decided first, explicitly, by `choose_merge_path`: it returns the
`MergePath` (`key_scan`, or `frame`: the merge reads file by file, `key_scan.FileReader`) and why.
The fallback is chosen when the key scan cannot be proven the same: a data or delete file that
is not Parquet, a table whose columns were ever renamed or retyped beyond widening (a file's
column name then need not be today's), a name mapping other than the schema's own names, or files
whose row counts disagree with their manifests; `scan_candidates` falls back too when polars cannot read a file as the schema
says.

Which data files a merge must look at: partition values and column statistics decide, before
any file is opened, which files can hold a row the compute's keys match, and which of the
compute's rows each file can match.

Owns `manifest_admission` (manifests whose partition summaries admit a key of the compute: the
others are never read), `prune_by_keys` (files whose partition and every key column's bounds
admit a key of the compute) and `KeySlices` (the compute's rows a file's bounds of the first key column admit: each
file is joined with its slice, not the whole batch).

Reading the data files a merge works on: one file at a time, deletes applied, positions kept,
with a bounded number of files in flight.

Owns `FileReader`: each candidate file is read whole (or only some columns) with the rows its
positional delete files remove filtered out, and every row keeps its physical position in the file
(`tables.FILEPOS_COLUMN`), which a merge-on-read write needs to delete it. `stream` yields the files
in order while at most `in_flight` are read ahead, so a merge over many files holds a bounded
number of them in memory (peak memory follows the largest file, not the number of files).
"""

from __future__ import annotations

import threading
import warnings
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan, PyArrowFileIO
from pyiceberg.manifest import DataFileContent, FileFormat, ManifestFile
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.types import (
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from pipeline_output.contract.checked_input import from_arrow, polars_schema
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.snapshot.files import deleted_positions, referenced_path
from pipeline_output.stores.iceberg.table.file_io import read_whole
from pipeline_output.stores.iceberg.table.partitions import key_partition_values, physical
from pipeline_output.stores.iceberg.table.tables import FILEPOS_COLUMN, READ_THREADS
from pipeline_output.stores.iceberg.write.frame_rows import (
    align_to_schema,
    read_local,
    values_differ,
)

G = "__po_g__"  # a row's index in the concatenation of the candidate files
L = "__po_l__"  # a row's index in the concatenation of the files one scan reads
B = "__po_b__"  # the compute row a target row's key matched
F = "__po_f__"  # a row's file: its index in the candidates
POS = "__po_filepos__"  # a row's physical position in its file
_OWN = "__po_own__"  # a deleted position from one of the file's own (file-scoped) delete files
_HIT = "__po_hit__"
_NAME_MAPPING = "schema.name-mapping.default"
_NONE = pl.Series(POS, [], pl.Int64)  # no positions (shared: never changed in place)
SIZE_SAMPLE = 64  # files whose column sizes order the comparison
# a candidate file this small is fetched whole (one GET) while the write holds at most the budget
WHOLE_FILE_BYTES = 8 * 1024 * 1024
WHOLE_BUDGET_BYTES = 64 * 1024 * 1024
VECTORISED = True  # False: every merge reads file by file (tests compare the two paths)


@dataclass(frozen=True)
class MergePath:
    """Which of the two sibling merges of an upsert, sync or append_new compares the rows
    (`merge.FileMerge.merge_by_key_scan` or `merge.FileMerge.merge_by_frame`), and why; both
    tell changed rows by `frame_rows.values_differ`. Reported as the write's `merge_path`."""

    name: Literal["key_scan", "frame"]
    why: str

    def __str__(self) -> str:
        return f"{self.name} ({self.why})"


def choose_merge_path(
    table: Table,
    schema: Schema,
    tasks: Sequence[FileScanTask],
    *,
    remote: ObjectFiles | None = None,
) -> MergePath:
    """The merge that applies a write to the candidate files `tasks`: the vectorised key scan
    when it is provably the same as reading file by file, else the file-by-file fallback and the
    first reason the key scan cannot be proven the same. `remote`: how files that are not local
    are read (pass the same to `scan_candidates`: footers are read once)."""
    if not VECTORISED:
        return MergePath("frame", "fallback: the key scan is switched off (key_scan.VECTORISED)")
    if not tasks:
        return MergePath("frame", "no candidate file: no target row to compare")
    remote = remote if remote is not None else ObjectFiles(table.io)
    why_not = _ineligible(table, schema, tasks) or _footers_disagree(tasks, remote)
    if why_not is not None:
        return MergePath("frame", f"fallback: {why_not}")
    where = "local" if all(_local(t.file.file_path) for t in tasks) else "object-store"
    return MergePath(
        "key_scan", f"{len(tasks)} candidate file(s), {where} Parquet, today's columns"
    )


@dataclass
class FileRows:
    """What the scan found in one candidate file."""

    task: FileScanTask
    index: int  # its place among the candidates (`ColumnReader.scan` takes these)
    live: int  # rows its delete files leave
    matched: int = 0
    changed: pl.Series = field(default_factory=lambda: _NONE)
    absent: pl.Series = field(default_factory=lambda: _NONE)
    deleted: pl.Series = field(default_factory=lambda: _NONE)
    own_deleted: pl.Series = field(default_factory=lambda: _NONE)


@dataclass
class CandidateRows:
    """The result of `scan_candidates`: per file, and every matched key (one row per match)."""

    files: list[FileRows]
    matched_keys: pl.DataFrame
    unchanged_keys: pl.DataFrame  # matched keys whose rows do not change (kept where they are)
    reader: ColumnReader


class ObjectFiles:
    """Candidate files that are not local, read through the table's own `FileIO` (its client,
    credentials and connections: S3, GCS, ... alike), files in parallel. A file of at most
    `WHOLE_FILE_BYTES` is fetched whole, once (on S3 one GET, no HEAD: `file_io.read_whole`),
    while the write holds at most `WHOLE_BUDGET_BYTES` of them: every pass over it (keys, the
    compared columns, a rewrite) then reads memory — as polars reads local files, when every
    candidate is in memory (`in_memory`). A larger one has its Parquet footer fetched once per
    write and only the columns a pass asks for fetched, in coalesced ranges; on pyarrow's FileIO
    it is opened through its file system (pyarrow 26 sends a HEAD when it opens a file, even one
    whose size is known: benchmarks/results/rest-catalog.md)."""

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self._opened: dict[str, Any] = {}
        self._whole: dict[str, bytes] = {}  # the files fetched whole
        self._held = 0  # bytes of files fetched whole
        self._guard = threading.Lock()

    def parquet_file(self, path: str, size: int) -> pq.ParquetFile:
        """The file opened as pyarrow's `ParquetFile`, its footer read (once). Not through
        `pyarrow.dataset`, whose first import imports pandas where it is installed (~0.35 s of
        a process's first write on an object store; `infra/deferred_imports.py`)."""
        with self._guard:
            found = self._opened.get(path)
        if found is not None:
            return found
        data = self._fetched(path, size)
        source: Any
        if data is not None:  # one GET for every pass over it, not one a column and row group
            source = pa.BufferReader(data)
        elif isinstance(self.io, PyArrowFileIO):
            scheme, netloc, inner = self.io.parse_location(path, self.io.properties)
            source = self.io.fs_by_scheme(scheme, netloc).open_input_file(inner)
        else:
            source = self.io.new_input(path).open()
        # pre_buffer: a pass's column chunks fetched in coalesced ranges, not one by one
        opened = pq.ParquetFile(source, pre_buffer=data is None)
        with self._guard:
            return self._opened.setdefault(path, opened)

    def in_memory(self, files: Sequence[tuple[str, int]]) -> list[bytes] | None:
        """The files' bytes when every one of them is fetched whole (fetching those not yet, in
        parallel), else None."""
        if any(size > WHOLE_FILE_BYTES for _, size in files):
            return None
        got: list[bytes | None] = self._each(files, lambda path, size: self._fetched(path, size))
        if any(data is None for data in got):
            return None
        return [data for data in got if data is not None]

    def _fetched(self, path: str, size: int) -> bytes | None:
        """The file's bytes, fetched whole if it is small enough and the budget allows."""
        with self._guard:
            found = self._whole.get(path)
            if found is not None:
                return found
            whole = size <= WHOLE_FILE_BYTES and self._held + size <= WHOLE_BUDGET_BYTES
            if whole:
                self._held += size
        if not whole:
            return None
        data = read_whole(self.io, path)
        with self._guard:
            return self._whole.setdefault(path, data)

    def rows(self, files: Sequence[tuple[str, int]]) -> int:
        """The rows the files' footers hold."""
        opened = self._each(files, self.parquet_file)
        return sum(f.metadata.num_rows for f in opened)

    def read(
        self, files: Sequence[tuple[str, int]], columns: Sequence[str], target: pl.Schema
    ) -> list[pl.DataFrame]:
        """`columns` of each file as `target` types them, a column the file lacks null (as the
        local scan's `missing_columns="insert"` and its upcasts)."""

        def one(file: pq.ParquetFile) -> pl.DataFrame:
            present = [c for c in columns if c in file.schema_arrow.names]
            table = file.read(columns=present)
            frame = from_arrow(table) if present else pl.DataFrame()
            return frame.select(
                (pl.col(c) if frame.schema[c] == target[c] else pl.col(c).cast(target[c]))
                if c in present
                else pl.repeat(None, table.num_rows, dtype=target[c]).alias(c)  # the file's rows
                for c in columns
            )

        return self._each(files, lambda path, size: one(self.parquet_file(path, size)))

    def _each(self, files: Sequence[tuple[str, int]], then: Callable[[str, int], Any]) -> list[Any]:
        def job(item: tuple[str, int]) -> Any:
            return then(*item)

        if len(files) <= 1:
            return [job(item) for item in files]
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(files))) as pool:
            return list(pool.map(job, files))


class ColumnReader:
    """Reads columns of some of the candidate files as one scan, rows numbered by `G`: local
    files as one polars scan, object-store files through `remote` (the table's FileIO)."""

    def __init__(
        self, tasks: Sequence[FileScanTask], target: pl.Schema, *, remote: ObjectFiles | None = None
    ) -> None:
        local = [_local(t.file.file_path) for t in tasks]
        # files that are not local: their delete files through `objects`; the data files in
        # memory (fetched whole) are scanned by polars as local ones are, others through `remote`
        self.objects = remote if remote is not None and not all(local) else None
        self.remote: ObjectFiles | None = None
        self.paths: list[Any] = list(local)  # local paths, or the files' bytes
        if self.objects is not None:
            files = [(t.file.file_path, int(t.file.file_size_in_bytes)) for t in tasks]
            whole = None if any(local) else self.objects.in_memory(files)
            if whole is not None:
                self.paths = whole
            else:
                self.paths, self.remote = [path for path, _ in files], self.objects
        self.sizes = [int(t.file.file_size_in_bytes) for t in tasks]
        self.counts = [int(t.file.record_count) for t in tasks]
        self.offsets = [0]
        for n in self.counts:
            self.offsets.append(self.offsets[-1] + n)
        self.target = target

    def scan(self, files: Sequence[int], columns: Sequence[str]) -> pl.LazyFrame:
        """`columns` of the candidate files numbered `files` (ascending), each row numbered by
        `L`, its index in the concatenation of those files (`G` when `files` are all of them;
        `local` maps `G` to `L`)."""
        if self.remote is not None:
            parts = self.remote.read(
                [(self.paths[f], self.sizes[f]) for f in files], columns, self.target
            )
            if not parts:
                empty = {L: pl.get_index_type(), **{c: self.target[c] for c in columns}}
                return pl.LazyFrame(schema=empty)
            return pl.concat(parts).with_row_index(L).lazy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ScanCastOptions is marked unstable
            frame = pl.scan_parquet(
                [self.paths[f] for f in files],
                schema=self.target,
                row_index_name=L,
                missing_columns="insert",
                extra_columns="ignore",
                cast_options=pl.ScanCastOptions(integer_cast="upcast", float_cast="upcast"),
                glob=False,
            )
        return frame.select(L, *columns)

    def delete_rows(self, paths: Sequence[str], sizes: Sequence[int]) -> pl.LazyFrame:
        """The rows (`file_path`, `pos`) of positional delete files, each with its own path
        as `ColumnReader.source` names it (`__po_delete_file__`)."""
        if self.objects is None:
            return pl.scan_parquet(
                [_local(p) for p in paths], glob=False, include_file_paths="__po_delete_file__"
            ).select("file_path", pl.col("pos").cast(pl.Int64), "__po_delete_file__")
        target = pl.Schema({"file_path": pl.String, "pos": pl.Int64})
        parts = self.objects.read(list(zip(paths, sizes, strict=True)), list(target), target)
        return pl.concat(
            part.with_columns(pl.lit(path).alias("__po_delete_file__"))
            for part, path in zip(parts, paths, strict=True)
        ).lazy()

    def source(self, path: str) -> str:
        """How `delete_rows` names the file at `path`."""
        return path if self.objects is not None else _local(path)

    def local(self, files: Sequence[int], g: pl.Expr) -> pl.Expr:
        """`L` in a `scan` of `files` of the row numbered `g` (in one of those files)."""
        sub = [0]
        for f in files:
            sub.append(sub[-1] + self.counts[f])
        shift = pl.Series([self.offsets[f] - sub[k] for k, f in enumerate(files)], dtype=pl.Int64)
        starts = pl.Series([self.offsets[f] for f in files], dtype=pl.Int64)
        which = pl.lit(starts).search_sorted(g, side="right").cast(pl.Int64) - 1
        return (g - pl.lit(shift).gather(which)).cast(pl.get_index_type())

    def file_of(self, g: pl.Expr) -> pl.Expr:
        return (
            pl.lit(pl.Series(self.offsets[:-1], dtype=pl.Int64))
            .search_sorted(g, side="right")
            .cast(pl.Int64)
            - 1
        )

    def position(self, g: pl.Expr) -> pl.Expr:
        starts = pl.lit(pl.Series(self.offsets[:-1], dtype=pl.Int64))
        return g - starts.gather(self.file_of(g))


def scan_candidates(
    table: Table,
    schema: Schema,
    frame: pl.DataFrame,
    tasks: Sequence[FileScanTask],
    *,
    pk: Sequence[str],
    absent_in: pl.Expr | None,
    scope_columns: Sequence[str] = (),
    compare: bool = True,
    remote: ObjectFiles | None = None,
) -> CandidateRows | MergePath:
    """Scan `tasks` (for which `choose_merge_path` chose the key scan) against the compute's
    `frame` (aligned to `schema`). `absent_in` (a sync):
    target rows whose key the frame lacks are deleted where it is true (`pl.lit(True)`: all),
    a predicate over the key columns and `scope_columns` (a window's watermark, a partition
    slice's columns) typed as `schema` says.
    Without `compare` (append_new: only which keys exist) no value is read and every matched
    row counts as unchanged. Returns the fallback `MergePath` when polars cannot read a file as
    the table's schema says (the merge then reads file by file). `remote`: as given to
    `choose_merge_path` (files that are not local are read through the table's FileIO)."""
    target = polars_schema(schema.as_arrow())
    remote = remote if remote is not None else ObjectFiles(table.io)
    reader = ColumnReader(tasks, target, remote=remote)
    try:
        values = [c for c in target if c not in pk] if compare else []
        order = _cheapest_first(schema, tasks, values)
        extra = [c for c in dict.fromkeys(scope_columns) if c not in pk]
        return _scan(reader, tasks, frame, list(pk), absent_in, extra, order)
    except (pl.exceptions.PolarsError, pa.ArrowException, OSError, ValueError, TypeError) as exc:
        why = (
            f"polars cannot read a candidate file as the table's schema says ({type(exc).__name__})"
        )
        return MergePath("frame", f"fallback: {why}")


def _scan(
    reader: ColumnReader,
    tasks: Sequence[FileScanTask],
    frame: pl.DataFrame,
    pk: list[str],
    absent_in: pl.Expr | None,
    extra: list[str],
    order: list[str],
) -> CandidateRows:
    everything = list(range(len(tasks)))
    deleted = _deleted(reader, tasks)
    keys = reader.scan(everything, [*pk, *extra]).rename({L: G})
    # the first key column's values prune the rows in the Parquet reader; then joins in memory
    wanted = pl.col(pk[0]).is_in(frame.get_column(pk[0]).implode())
    rows = keys.filter(wanted if absent_in is None else wanted | absent_in).collect()
    rows = rows.with_columns(pl.col(G).cast(pl.Int64))
    if deleted.height:
        rows = rows.join(deleted.select(G), on=G, how="anti")
    batch = frame.select(pk).with_row_index(B)
    if absent_in is None:
        matched = rows.join(batch, on=pk, how="inner", nulls_equal=True)
        absent = pl.DataFrame(schema={G: pl.Int64})
    else:
        joined = rows.join(batch, on=pk, how="left", nulls_equal=True)
        matched = joined.filter(pl.col(B).is_not_null())
        absent = joined.filter(pl.col(B).is_null() & absent_in).select(G)
    matched = matched.select(G, B, *pk)
    changed = _changed(reader, frame, matched, order)
    return CandidateRows(
        files=_per_file(reader, tasks, deleted, matched, changed, absent),
        matched_keys=matched.select(pk),
        unchanged_keys=matched.join(changed, on=G, how="anti").select(pk),
        reader=reader,
    )


def _deleted(reader: ColumnReader, tasks: Sequence[FileScanTask]) -> pl.DataFrame:
    """`G` of every row the tasks' delete files remove, and whether one of the file's own
    (file-scoped) delete files removes it."""
    files: dict[str, list[tuple[int, bool]]] = {}
    sizes: dict[str, int] = {}
    for f, task in enumerate(tasks):
        for d in task.delete_files:
            own = referenced_path(d) == task.file.file_path
            files.setdefault(d.file_path, []).append((f, own))
            sizes[d.file_path] = int(d.file_size_in_bytes)
    if not files:
        return pl.DataFrame(schema={G: pl.Int64, _OWN: pl.Boolean})
    paths = list(files)
    rows = reader.delete_rows(paths, [sizes[p] for p in paths])
    data = {t.file.file_path: f for f, t in enumerate(tasks)}
    owners = pl.DataFrame(
        [
            {"__po_delete_file__": reader.source(d), F: f, _OWN: own}
            for d, applies in files.items()
            for f, own in applies
        ],
        schema={"__po_delete_file__": pl.String, F: pl.Int64, _OWN: pl.Boolean},
    )
    by_path = pl.DataFrame(
        {"file_path": list(data), "__po_data__": list(data.values())},
        schema={"file_path": pl.String, "__po_data__": pl.Int64},
    )
    starts = pl.Series(reader.offsets[:-1], dtype=pl.Int64)
    found = (
        rows.join(by_path.lazy(), on="file_path", how="inner")
        .join(owners.lazy(), on="__po_delete_file__", how="inner")
        .filter(pl.col(F) == pl.col("__po_data__"))  # a delete file applies to its task's file
        .select((pl.lit(starts).gather(pl.col(F)) + pl.col("pos")).alias(G), _OWN)
        .collect()
    )
    return found.group_by(G).agg(pl.col(_OWN).any()).sort(G)


def _changed(
    reader: ColumnReader, frame: pl.DataFrame, matched: pl.DataFrame, order: list[str]
) -> pl.DataFrame:
    """`G` of the matched rows whose values differ from their compute row (`values_differ`),
    column by column (cheapest first); a row found to differ is not read again."""
    if not order or matched.height == 0:
        return pl.DataFrame(schema={G: pl.Int64})
    undecided = matched.select(G, B)
    found: list[pl.DataFrame] = []
    for column in order:
        files = undecided.select(reader.file_of(pl.col(G)).unique().sort()).to_series().to_list()
        wanted = undecided.select(G, reader.local(files, pl.col(G)).alias(L))
        got = (
            reader.scan(files, [column])
            .filter(pl.col(L).is_in(wanted.get_column(L).implode()))
            .collect()
            .join(wanted, on=L, how="inner")
            .drop(L)
        )
        rows = undecided.join(got, on=G, how="inner")
        new = frame.get_column(column).gather(rows.get_column(B))
        differ = values_differ(rows.get_column(column), new)
        found.append(rows.filter(differ).select(G))
        undecided = rows.filter(~differ).select(G, B)
        if undecided.height == 0:
            break
    return pl.concat(found)


def _cheapest_first(schema: Schema, tasks: Sequence[FileScanTask], columns: list[str]) -> list[str]:
    """`columns` by their stored bytes in (up to `SIZE_SAMPLE` of) the candidate files
    (manifests' `column_sizes`, a nested column's leaves added up; unknown: last), smallest
    first, ties in table order."""
    leaves = {name: _leaf_ids(schema, name) for name in columns}
    totals = dict.fromkeys(columns, 0)
    for task in tasks[:: max(1, len(tasks) // SIZE_SAMPLE)][:SIZE_SAMPLE]:
        known = dict(task.file.column_sizes or {})  # (pyiceberg's maps rebuild on each lookup)
        for name, ids in leaves.items():
            if totals[name] < 0:
                continue
            if all(i in known for i in ids):
                totals[name] += sum(known[i] for i in ids)
            else:
                totals[name] = -1
    sizes = {name: n for name, n in totals.items() if n >= 0}
    return sorted(columns, key=lambda c: (sizes.get(c, 1 << 62), columns.index(c)))


def _leaf_ids(schema: Schema, name: str) -> list[int]:
    """The field ids of a column's primitive leaves (itself when it is primitive)."""
    top = schema.find_field(name)
    if top.field_type.is_primitive:
        return [top.field_id]
    nested = index_by_id(top.field_type).items()
    return [field_id for field_id, field in nested if field.field_type.is_primitive]


def _per_file(
    reader: ColumnReader,
    tasks: Sequence[FileScanTask],
    deleted: pl.DataFrame,
    matched: pl.DataFrame,
    changed: pl.DataFrame,
    absent: pl.DataFrame,
) -> list[FileRows]:
    """Each file's counts and positions: every kind of row sorted by file and position once,
    each file's positions a zero-copy slice of that (no Python list of positions)."""
    dels = _by_file(reader, deleted, own=True)
    hits = _by_file(reader, matched.select(G))
    diffs = _by_file(reader, matched.join(changed, on=G, how="semi").select(G))
    gone = _by_file(reader, absent.select(G))
    out = []
    for f, task in enumerate(tasks):
        d = dels.get(f)
        rows = FileRows(task=task, index=f, live=reader.counts[f] - (d[0].len() if d else 0))
        if d is not None:
            rows.deleted = d[0]
            if d[1] is not None and d[1].len():
                rows.own_deleted = d[1]
        if (h := hits.get(f)) is not None:
            rows.matched = h[0].len()
        if (c := diffs.get(f)) is not None:
            rows.changed = c[0]
        if (a := gone.get(f)) is not None:
            rows.absent = a[0]
        out.append(rows)
    return out


def _by_file(
    reader: ColumnReader, rows: pl.DataFrame, *, own: bool = False
) -> dict[int, tuple[pl.Series, pl.Series | None]]:
    """The positions (`POS`, ascending) of `rows` (by `G`) in each file that has one; with
    `own`, also those of them a file-scoped delete file of the file's own removes (`_OWN`)."""
    if rows.height == 0:
        return {}
    found = rows.select(
        reader.file_of(pl.col(G)).alias(F),
        reader.position(pl.col(G)).alias(POS),
        *([pl.col(_OWN)] if own else []),
    ).sort(F, POS)
    files = found.get_column(F)
    which = files.unique(maintain_order=True)
    starts = files.search_sorted(which, side="left").to_list()
    ends = files.search_sorted(which, side="right").to_list()
    pos = found.get_column(POS)
    out: dict[int, tuple[pl.Series, pl.Series | None]] = {}
    for f, i, j in zip(which.to_list(), starts, ends, strict=True):
        mine = pos.slice(i, j - i)
        mask = found.get_column(_OWN).slice(i, j - i) if own else None
        out[int(f)] = (mine, mine.filter(mask) if mask is not None else None)
    return out


def _ineligible(table: Table, schema: Schema, tasks: Sequence[FileScanTask]) -> str | None:
    """Why the key scan cannot read `tasks` (None: it can): unless every file is Parquet (local,
    or read through the table's FileIO), a name mapping (if any) is the schema's own, and every
    column of `schema` has had one name and one field id in every schema of the table
    (so a file's column names are today's)."""
    for task in tasks:
        files = [task.file, *task.delete_files]
        for f in files:
            if f.file_format != FileFormat.PARQUET:
                return f"{f.file_path} is not a Parquet file"
        if any(d.content != DataFileContent.POSITION_DELETES for d in task.delete_files):
            return f"{task.file.file_path} carries equality deletes"
    current = {f.field_id: f for f in schema.fields}
    names = {f.name: f.field_id for f in schema.fields}
    for past in table.metadata.schemas:
        for old in past.fields:
            now = current.get(old.field_id)
            if names.get(old.name, old.field_id) != old.field_id:
                return f"column name {old.name!r} belonged to another field in an older schema"
            if now is None:
                continue
            if now.name != old.name:
                return f"column {now.name!r} was renamed (from {old.name!r})"
            if not isinstance(now.field_type, PrimitiveType) and now.field_type != old.field_type:
                return f"the nested column {now.name!r} changed type"
    if _NAME_MAPPING in table.metadata.properties:
        # a file without field ids is read by the mapping's names: the same as by today's names
        # only when the mapping is the current schema's own (one name a field: some catalogs,
        # SeaweedFS's, set it on every table they create)
        try:
            own = table.name_mapping() == create_mapping_from_schema(table.schema())
        except ValueError:
            own = False
        if not own:
            return f"the table has a name mapping ({_NAME_MAPPING}) other than its schema's names"
    return None


def _footers_disagree(tasks: Sequence[FileScanTask], remote: ObjectFiles) -> str | None:
    """Why the files' Parquet footers cannot number their rows as the manifests do (None: they
    hold as many rows as their manifests say)."""
    paths = [_local(t.file.file_path) for t in tasks]
    try:
        if all(paths):
            total = pl.scan_parquet(paths, glob=False).select(pl.len()).collect().item()
        else:
            total = remote.rows([(t.file.file_path, int(t.file.file_size_in_bytes)) for t in tasks])
    except (pl.exceptions.PolarsError, pa.ArrowException, OSError, ValueError, TypeError) as exc:
        return f"polars cannot read the candidate files' footers ({type(exc).__name__})"
    if int(total) != sum(int(t.file.record_count) for t in tasks):
        return "the candidate files' row counts disagree with their manifests"
    return None


def _local(path: str) -> str:
    if path.startswith("file://"):
        return path.removeprefix("file://")
    return path if path.startswith("/") else ""


def prune_by_keys(
    table: Table, spec: DatasetSpec, frame: pl.DataFrame, tasks: list[FileScanTask]
) -> list[FileScanTask]:
    """Files whose partition (when the table is partitioned by a key column) and key
    statistics admit at least one of the compute's keys: a matching row has every key
    column inside the file's bounds, so each key column prunes (composite keys too)."""
    if not tasks or frame.height == 0:
        return []
    tasks = _prune_by_partition(table, spec, frame, tasks)
    schema = table.schema()
    columns = []
    for name in spec.primary_key:
        field = schema.find_field(name)
        if isinstance(field.field_type, PrimitiveType):
            values = physical(frame.get_column(name), field.field_type)
            columns.append((field, values.sort()))  # a write's frame is sorted by it already
    admitted = [True] * len(tasks)
    for field, keys in columns:
        admitted = [a and b for a, b in zip(admitted, _admits_all(tasks, field, keys), strict=True)]
    return [t for t, ok in zip(tasks, admitted, strict=True) if ok]


def manifest_admission(
    metadata: TableMetadata, spec: DatasetSpec, frame: pl.DataFrame
) -> Callable[[ManifestFile], bool] | None:
    """Which data manifests can hold a row with one of the compute's keys, from the manifest
    list's partition summaries alone (no manifest is opened): a manifest of the current spec
    whose range of a key-sourced partition field holds none of the batch's partition values of
    that field holds no candidate. None: nothing to prune by (an unpartitioned table, or no
    partition field sourced from a key column)."""
    wanted = key_partition_values(spec, metadata, frame)
    if wanted is None:
        return None
    current = metadata.spec()
    schema = metadata.schema()
    fields = []
    for i, values in wanted.items():
        pfield = current.fields[i]
        result_type = pfield.transform.result_type(schema.find_field(pfield.source_id).field_type)
        if not isinstance(result_type, PrimitiveType):
            continue
        present: list[Any] = sorted(v for v in values if v is not None)
        fields.append((i, result_type, present, None in values))

    def admits(manifest: ManifestFile) -> bool:
        summaries = manifest.partitions
        if manifest.partition_spec_id != current.spec_id or not summaries:
            return True
        for i, result_type, present, null_wanted in fields:
            if i >= len(summaries):
                return True
            summary = summaries[i]
            if null_wanted and summary.contains_null:
                continue
            if summary.lower_bound is None or summary.upper_bound is None:
                # only nulls in this field and no null wanted: no candidate; no bounds: read it
                return not (summary.contains_null and summary.lower_bound is None)
            try:
                lo = from_bytes(result_type, summary.lower_bound)
                hi = from_bytes(result_type, summary.upper_bound)
                at = bisect_left(present, lo)
                if at == len(present) or present[at] > hi:
                    return False
            except (TypeError, ValueError):
                return True  # bounds not comparable with the values: read it
        return True

    return admits


def _prune_by_partition(
    table: Table, spec: DatasetSpec, frame: pl.DataFrame, tasks: list[FileScanTask]
) -> list[FileScanTask]:
    """Drop files of the current spec whose partition no key of the compute falls in."""
    metadata = table.metadata
    wanted = key_partition_values(spec, metadata, frame)
    if wanted is None:
        return tasks
    current = metadata.default_spec_id
    return [
        t
        for t in tasks
        if t.file.spec_id != current
        or all(t.file.partition[i] in values for i, values in wanted.items())
    ]


def _decoded_bounds(task: FileScanTask, field: NestedField) -> tuple[Any, Any] | None:
    """The file's (lower, upper) bounds of `field`, decoded; None when it has none."""
    lo_b = task.file.lower_bounds.get(field.field_id) if task.file.lower_bounds else None
    hi_b = task.file.upper_bounds.get(field.field_id) if task.file.upper_bounds else None
    if lo_b is None or hi_b is None:
        return None
    return (
        from_bytes(field.field_type, lo_b),  # type: ignore[arg-type]
        from_bytes(field.field_type, hi_b),  # type: ignore[arg-type]
    )


# Iceberg's single-value serialisation of these types, as polars reads the bytes back
_LITTLE_ENDIAN: dict[type, type[pl.DataType]] = {
    IntegerType: pl.Int32,
    DateType: pl.Int32,
    LongType: pl.Int64,
    TimestampType: pl.Int64,
    TimestamptzType: pl.Int64,
    FloatType: pl.Float32,
    DoubleType: pl.Float64,
}


def _bound_series(
    tasks: list[FileScanTask], field: NestedField, dtype: pl.DataType
) -> tuple[pl.Series, pl.Series] | None:
    """Every file's (lower, upper) bounds of `field` decoded in one vectorised pass (null where
    a file has none), as `dtype`; None for a type decoded value by value (`_decoded_bounds`)."""
    kind = type(field.field_type)
    if kind not in _LITTLE_ENDIAN and kind is not StringType:
        return None
    fid = field.field_id
    lows: list[bytes | None] = []
    highs: list[bytes | None] = []
    for task in tasks:
        lower, upper = task.file.lower_bounds, task.file.upper_bounds
        lo, hi = (lower.get(fid) if lower else None), (upper.get(fid) if upper else None)
        present = lo is not None and hi is not None
        lows.append(lo if present else None)
        highs.append(hi if present else None)
    out = []
    for raw in (lows, highs):
        series = pl.Series(raw, dtype=pl.Binary)
        if kind is StringType:
            decoded = series.cast(pl.String)
        else:
            decoded = series.bin.reinterpret(dtype=_LITTLE_ENDIAN[kind], endianness="little")
        out.append(decoded.cast(dtype, strict=True))
    return out[0], out[1]


def _admits_all(tasks: list[FileScanTask], field: NestedField, keys: pl.Series) -> list[bool]:
    """For each file: whether one of the sorted `keys` lies within its bounds of `field` (True when
    the file has no bounds for it, or they cannot be compared). One vectorised search over every
    file's bounds: the cost stays small when the table has thousands of files."""
    try:
        both = _bound_series(tasks, field, keys.dtype)
        if both is None:
            bounds = [_decoded_bounds(task, field) for task in tasks]
            lo = pl.Series([b[0] if b else None for b in bounds], dtype=keys.dtype, strict=True)
            hi = pl.Series([b[1] if b else None for b in bounds], dtype=keys.dtype, strict=True)
        else:
            lo, hi = both
        i = keys.search_sorted(lo, side="left")
        j = keys.search_sorted(hi, side="right")
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return [True] * len(tasks)
    missing = lo.is_null() | hi.is_null()
    return (missing | (j > i)).to_list()


class KeySlices:
    """The compute's rows a file's bounds of the first key column admit (a row of the file can
    only match those): each file is joined with its slice instead of the whole batch, so a merge
    over many files costs about files + batch rows, not files x batch rows. The batch is sorted
    by that column once; a slice is a zero-copy window of it, found by binary search (for many
    files at once with `prepare`)."""

    def __init__(self, frame: pl.DataFrame, column: str, schema: Schema) -> None:
        self.frame = frame
        self.field = schema.find_field(column)
        self.sorted: pl.Series | None = None
        self._cache: dict[str, pl.DataFrame] = {}
        if isinstance(self.field.field_type, PrimitiveType) and frame.height > 1:
            values = physical(frame.get_column(column), self.field.field_type)
            if values.is_sorted() and not values.has_nulls():  # a write's frame is, by its key
                self.sorted, self._by_key = values, frame
            else:
                order = values.arg_sort()
                self.sorted = values.gather(order)
                self._by_key = frame[order]

    def prepare(self, tasks: list[FileScanTask]) -> None:
        """Find the slices of every task in one vectorised search."""
        if self.sorted is None or not tasks:
            return
        dtype = self.sorted.dtype
        if not (dtype.is_integer() or dtype.is_float() or dtype in (pl.String, pl.Date)):
            return  # decoded bounds are not values of this dtype (time: micros): per file
        bounds = [_decoded_bounds(task, self.field) for task in tasks]
        try:
            lo = pl.Series([b[0] if b else None for b in bounds], dtype=self.sorted.dtype)
            hi = pl.Series([b[1] if b else None for b in bounds], dtype=self.sorted.dtype)
            starts = self.sorted.search_sorted(lo, side="left").to_list()
            ends = self.sorted.search_sorted(hi, side="right").to_list()
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            return
        for task, b, i, j in zip(tasks, bounds, starts, ends, strict=True):
            if b is not None:
                self._cache[task.file.file_path] = self._window(int(i), int(j))

    def of(self, task: FileScanTask) -> pl.DataFrame:
        cached = self._cache.get(task.file.file_path)
        if cached is None:
            cached = self._cache[task.file.file_path] = self._slice(task)
        return cached

    def _slice(self, task: FileScanTask) -> pl.DataFrame:
        bounds = _decoded_bounds(task, self.field)
        if self.sorted is None or bounds is None:
            return self.frame
        try:
            i = int(self.sorted.search_sorted(bounds[0], side="left"))
            j = int(self.sorted.search_sorted(bounds[1], side="right"))
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            return self.frame
        return self._window(i, j)

    def _window(self, i: int, j: int) -> pl.DataFrame:
        if i == 0 and j == self.frame.height:
            return self.frame
        return self._by_key.slice(i, max(j - i, 0))


class FileReader:
    """Reads data files of `table` aligned to `schema` (the schema the write works in)."""

    def __init__(self, table: Table, schema: Schema, *, in_flight: int = READ_THREADS) -> None:
        self.table = table
        self.schema = schema
        self.in_flight = max(1, in_flight)

    def read(self, task: FileScanTask, *, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The file's live rows (`columns` only, if given) and their positions (`FILEPOS_COLUMN`)."""
        read_schema = self.table.schema()
        if columns is not None:
            read_schema = read_schema.select(*columns)
        bare = FileScanTask(task.file)  # every row, in file order: positions are physical
        frame = read_local(bare, read_schema)
        if frame is None:
            scan = ArrowScan(self.table.metadata, self.table.io, read_schema, AlwaysTrue())
            frame = from_arrow(scan.to_table([bare]))
        frame = align_to_schema(frame, self.schema, only=columns).with_row_index(FILEPOS_COLUMN)
        frame = frame.with_columns(pl.col(FILEPOS_COLUMN).cast(pl.Int64))
        if task.delete_files:
            gone = deleted_positions(self.table.io, task)
            if gone.len():
                frame = frame.filter(~pl.col(FILEPOS_COLUMN).is_in(gone.implode()))
        return frame

    def stream(
        self, tasks: Sequence[FileScanTask], *, columns: Sequence[str] | None = None
    ) -> Iterator[tuple[FileScanTask, pl.DataFrame]]:
        """`(task, frame)` for every task, in order, at most `in_flight` files read ahead."""
        if not tasks:
            return
        if len(tasks) == 1:
            yield tasks[0], self.read(tasks[0], columns=columns)
            return
        workers = min(self.in_flight, len(tasks))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque[tuple[FileScanTask, Future[pl.DataFrame]]] = deque()
            queued = iter(tasks)

            def top_up() -> None:
                while len(pending) < workers:
                    task = next(queued, None)
                    if task is None:
                        return
                    pending.append((task, pool.submit(self.read, task, columns=columns)))

            top_up()
            while pending:
                task, future = pending.popleft()
                frame = future.result()
                top_up()
                yield task, frame
