"""One vectorised pass over a merge's candidate files: which of their live rows the compute's keys
match (a sync: which it leaves out), and which matched rows really change.

Owns `scan_candidates`. The candidate data files are read as ONE polars multi-file Parquet scan
(no collect per file): only the key columns (and those of a sync's window or partition slice),
every row numbered by its place in the concatenation of the files (`G`), which with the files' record counts gives its file
and its physical position (the positions a merge-on-read delete file holds). The rows the files'
positional delete files remove (read the same way, one scan) are left out, and the rest is joined
with the compute's keys on the fly (polars' streaming engine: memory follows the batch and the
matches, not the files).

Telling changed matched rows from unchanged ones needs their values, and reading every column of
every touched file is what made a spread upsert cost ~10x its floor. Rows are compared column by
column instead, cheapest column first (by the files' `column_sizes`): a row that differs in one
column is changed and not looked at again, so an upsert that changes a small column of every
matched row (a status, a timestamp, a version) reads that column and stops; only rows equal in
every column so far are read on. Columns are gathered at the matched positions only.

Returns None — the merge then reads file by file (`file_reads.FileReader`) — when the fast path
cannot be proven the same: a data or delete file that is not local Parquet, a table whose columns
were ever renamed or retyped beyond widening (a file's column name then need not be today's), a
name mapping, or files whose row counts disagree with their manifests.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl
from pyiceberg.manifest import DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import IcebergType, ListType, MapType, PrimitiveType

from pipeline_output.contract.checked_input import polars_schema
from pipeline_output.stores.iceberg.snapshot.delete_files import referenced_path

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
VECTORISED = True  # False: every merge reads file by file (tests compare the two paths)


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


class ColumnReader:
    """Reads columns of some of the candidate files as one scan, rows numbered by `G`."""

    def __init__(self, tasks: Sequence[FileScanTask], target: pl.Schema) -> None:
        self.paths = [_local(t.file.file_path) for t in tasks]
        self.counts = [int(t.file.record_count) for t in tasks]
        self.offsets = [0]
        for n in self.counts:
            self.offsets.append(self.offsets[-1] + n)
        self.target = target

    def scan(self, files: Sequence[int], columns: Sequence[str]) -> pl.LazyFrame:
        """`columns` of the candidate files numbered `files` (ascending), each row numbered by
        `L`, its index in the concatenation of those files (`G` when `files` are all of them;
        `local` maps `G` to `L`)."""
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

    def rows_match_manifests(self) -> bool:
        """Whether the files hold as many rows as their manifests say (Parquet footers)."""
        total = pl.scan_parquet(self.paths, glob=False).select(pl.len()).collect().item()
        return int(total) == self.offsets[-1]


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
) -> CandidateRows | None:
    """Scan `tasks` against the compute's `frame` (aligned to `schema`). `absent_in` (a sync):
    target rows whose key the frame lacks are deleted where it is true (`pl.lit(True)`: all),
    a predicate over the key columns and `scope_columns` (a window's watermark, a partition
    slice's columns) typed as `schema` says.
    Without `compare` (append_new: only which keys exist) no value is read and every matched
    row counts as unchanged."""
    if not VECTORISED or not tasks or not _eligible(table, schema, tasks):
        return None
    target = polars_schema(schema.as_arrow())
    reader = ColumnReader(tasks, target)
    try:
        if not reader.rows_match_manifests():
            return None
        values = [c for c in target if c not in pk] if compare else []
        order = _cheapest_first(schema, tasks, values)
        extra = [c for c in dict.fromkeys(scope_columns) if c not in pk]
        return _scan(reader, tasks, frame, list(pk), absent_in, extra, order)
    except (pl.exceptions.PolarsError, OSError, ValueError, TypeError):
        return None  # a file polars cannot read as the table's schema says: file by file


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
    for f, task in enumerate(tasks):
        for d in task.delete_files:
            own = referenced_path(d) == task.file.file_path
            files.setdefault(d.file_path, []).append((f, own))
    if not files:
        return pl.DataFrame(schema={G: pl.Int64, _OWN: pl.Boolean})
    paths = list(files)
    rows = pl.scan_parquet(
        [_local(p) for p in paths], glob=False, include_file_paths="__po_delete_file__"
    ).select("file_path", pl.col("pos").cast(pl.Int64), "__po_delete_file__")
    data = {t.file.file_path: f for f, t in enumerate(tasks)}
    owners = pl.DataFrame(
        [
            {"__po_delete_file__": _local(d), F: f, _OWN: own}
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
    """`G` of the matched rows whose values differ from their compute row, column by column
    (cheapest first); a row found to differ is not read again."""
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
        differ = ~rows.get_column(column).eq_missing(new)
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
    leaves: list[int] = []

    def walk(field_id: int, field_type: IcebergType) -> None:
        if isinstance(field_type, PrimitiveType):
            leaves.append(field_id)
            return
        for child in getattr(field_type, "fields", ()):
            walk(child.field_id, child.field_type)
        if isinstance(field_type, ListType):
            walk(field_type.element_id, field_type.element_type)
        if isinstance(field_type, MapType):
            walk(field_type.key_id, field_type.key_type)
            walk(field_type.value_id, field_type.value_type)

    walk(top.field_id, top.field_type)
    return leaves


def _per_file(
    reader: ColumnReader,
    tasks: Sequence[FileScanTask],
    deleted: pl.DataFrame,
    matched: pl.DataFrame,
    changed: pl.DataFrame,
    absent: pl.DataFrame,
) -> list[FileRows]:
    """Each file's counts and positions, from one group-by (not a frame per file)."""
    kinds = {
        "deleted": deleted.select(G, pl.col(_OWN)),
        "matched": matched.select(G, pl.lit(False).alias(_OWN)),
        "changed": matched.join(changed, on=G, how="semi").select(G, pl.lit(False).alias(_OWN)),
        "absent": absent.select(G, pl.lit(False).alias(_OWN)),
    }
    parts = [f.with_columns(pl.lit(k).alias("__po_kind__")) for k, f in kinds.items() if f.height]
    found: dict[tuple[int, str], tuple[list[int], list[bool]]] = {}
    if parts:
        every = pl.concat(parts).with_columns(
            reader.file_of(pl.col(G)).alias(F), reader.position(pl.col(G)).alias(POS)
        )
        for f, kind, pos, own in (
            every.sort(POS).group_by(F, "__po_kind__").agg(pl.col(POS), pl.col(_OWN)).iter_rows()
        ):
            found[(f, kind)] = (pos, own)
    dels = {
        f: (pos, [p for p, o in zip(pos, own, strict=True) if o])
        for (f, kind), (pos, own) in found.items()
        if kind == "deleted"
    }
    hits = {f: (len(pos),) for (f, kind), (pos, _) in found.items() if kind == "matched"}
    diffs = {f: (pos,) for (f, kind), (pos, _) in found.items() if kind == "changed"}
    gone = {f: (pos,) for (f, kind), (pos, _) in found.items() if kind == "absent"}
    out = []
    for f, task in enumerate(tasks):
        d = dels.get(f)
        live = reader.counts[f] - (len(d[0]) if d is not None else 0)
        rows = FileRows(task=task, index=f, live=live)
        if d is not None:
            rows.deleted = pl.Series(POS, d[0], dtype=pl.Int64)
            if d[1]:
                rows.own_deleted = pl.Series(POS, d[1], dtype=pl.Int64)
        if (h := hits.get(f)) is not None:
            rows.matched = int(h[0])
        if (c := diffs.get(f)) is not None:
            rows.changed = pl.Series(POS, c[0], dtype=pl.Int64)
        if (a := gone.get(f)) is not None:
            rows.absent = pl.Series(POS, a[0], dtype=pl.Int64)
        out.append(rows)
    return out


def _eligible(table: Table, schema: Schema, tasks: Sequence[FileScanTask]) -> bool:
    """Whether every file is local Parquet and every column of `schema` has had one name and
    one field id in every schema of the table (so a file's column names are today's)."""
    if _NAME_MAPPING in table.metadata.properties:
        return False
    for task in tasks:
        files = [task.file, *task.delete_files]
        if any(f.file_format != FileFormat.PARQUET or not _local(f.file_path) for f in files):
            return False
        if any(d.content != DataFileContent.POSITION_DELETES for d in task.delete_files):
            return False
    current = {f.field_id: f for f in schema.fields}
    names = {f.name: f.field_id for f in schema.fields}
    for past in table.metadata.schemas:
        for old in past.fields:
            now = current.get(old.field_id)
            if names.get(old.name, old.field_id) != old.field_id:
                return False  # the name belonged to another field
            if now is None:
                continue
            if now.name != old.name:
                return False  # renamed
            if not isinstance(now.field_type, PrimitiveType) and now.field_type != old.field_type:
                return False  # a nested type changed (a sub-field renamed, added, ...)
    return True


def _local(path: str) -> str:
    if path.startswith("file://"):
        return path.removeprefix("file://")
    return path if path.startswith("/") else ""
