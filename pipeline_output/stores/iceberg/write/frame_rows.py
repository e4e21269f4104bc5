"""Frame and row helpers of a native write: reading one data file, aligning a frame to the
table schema, sorting, evolving the schema inside a transaction — and the one definition of
"a matched row changed" (`values_differ`, `rows_differ`) that every merge path calls.

Where a merge puts the rows of the files it rewrites: written out as data files as they come,
so a copy-on-write merge over many files holds a bounded amount of rewritten rows in memory.

Rows are buffered until `flush_bytes` (in memory) are reached, then written sorted by the
dataset's sort columns through the write's `DataFileWriter` (files near the table's target size,
one partition per file). What is still buffered at the end is handed back (`rest`): the merge
writes it together with its inserts as one sorted frame, so a small write still adds one file.
Files written here belong to no snapshot until the write commits them; the write deletes them if
it does not commit.

The target rows a scoped write may delete — a delta window of the watermark column, or a Dagster
partition's slice — as a predicate (a mask over rows read from a data file, a filter of the
vectorised key scan) and as a file's relation to it from its column bounds (`inside` files are dropped whole, `outside` ones are not read at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Transaction

from pipeline_output.contract.checked_input import polars_schema
from pipeline_output.contract.plan import WritePlan
from pipeline_output.contract.slices import PartitionSlice
from pipeline_output.contract.spec import SCOPED, DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.errors import BadInput
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
from pipeline_output.stores.iceberg.table.partitions import slice_relation, window_relation
from pipeline_output.stores.iceberg.table.tables import NEW_PREFIX, POS_COLUMN
from pipeline_output.stores.schema import Evolution

# -- helpers ---------------------------------------------------------------------------------


def replace_rows(
    rows: pl.DataFrame, changed: pl.DataFrame, value_cols: list[str], pk: list[str]
) -> pl.DataFrame:
    """`rows` with the `changed` rows' new values put in place (rows keep their file order)."""
    if changed.height == 0 or not value_cols:
        return rows
    positions = changed.get_column(POS_COLUMN)
    try:
        return rows.with_columns(
            [
                rows.get_column(c).clone().scatter(positions, changed.get_column(NEW_PREFIX + c))
                for c in value_cols
            ]
        )
    except (pl.exceptions.PolarsError, TypeError):
        # Types scatter cannot take (nested): replace rows by position and restore the order.
        drop = pl.zeros(rows.height, dtype=pl.Boolean, eager=True).scatter(positions, True)
        updated = changed.select(
            [POS_COLUMN, *pk, *[pl.col(NEW_PREFIX + c).alias(c) for c in value_cols]]
        )
        return pl.concat([rows.filter(~drop), updated.select(rows.columns)]).sort(POS_COLUMN)


def read_local(task: FileScanTask, schema: Schema) -> pl.DataFrame | None:
    """Read a local data file straight with polars when that is provably the same as a scan.

    Only for files without delete files whose Parquet field ids name the same columns as the
    table schema (no renames); anything else goes through pyiceberg's `ArrowScan`.
    """
    path = task.file.file_path
    if task.delete_files or not (path.startswith("file://") or path.startswith("/")):
        return None
    local = path.removeprefix("file://")
    try:
        file_schema = pq.read_schema(local)
    except (OSError, pa.ArrowException):
        return None
    ids = {}
    for f in file_schema:
        raw = (f.metadata or {}).get(b"PARQUET:field_id")
        if raw is None:
            return None
        ids[f.name] = int(raw)
    wanted = []
    for f in schema.fields:
        if f.name in ids:
            if ids[f.name] != f.field_id:
                return None
            wanted.append(f.name)
        elif f.field_id in ids.values():
            return None
    return pl.read_parquet(local, columns=wanted)


def apply_evolution(tx: Transaction, evolution: Evolution) -> None:
    """Stage the schema changes in the write's own transaction (one commit with the data)."""
    if evolution.empty:
        return
    with tx.update_schema() as update:
        for name, new_type in evolution.add:
            update.add_column(name, new_type)
        for name, wider in evolution.widen:
            update.update_column(name, field_type=wider)


def schema_names(schema: Schema) -> list[str]:
    return [f.name for f in schema.fields]


def align_to_schema(
    frame: pl.DataFrame,
    schema: Schema,
    *,
    only: Sequence[str] | None = None,
    target: pl.Schema | None = None,
) -> pl.DataFrame:
    """`frame` with the schema's columns (missing ones null) cast to the schema's polars types
    (`target`: those types, when the caller converted the schema once already)."""
    if target is None:
        target = polars_schema(schema.as_arrow())
    names = list(only) if only is not None else list(target)
    exprs = []
    for name in names:
        dtype = target[name]
        if name in frame.columns:
            col = pl.col(name)
            exprs.append(col if frame.schema[name] == dtype else col.cast(dtype))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return frame.select(exprs)


def sorted_for_write(frame: pl.DataFrame, spec: DatasetSpec) -> pl.DataFrame:
    cols = [c for c in spec.sort_columns if c in frame.columns]
    if not cols or frame.height < 2:
        return frame
    if len(cols) == 1 and frame.get_column(cols[0]).is_sorted():
        return frame
    return frame.sort(cols, nulls_last=False, maintain_order=True)


# -- what counts as a changed row ---------------------------------------------------------


@overload
def values_differ(old: pl.Series, new: pl.Series) -> pl.Series: ...
@overload
def values_differ(old: pl.Expr, new: pl.Expr) -> pl.Expr: ...
def values_differ(old: pl.Series | pl.Expr, new: pl.Series | pl.Expr) -> pl.Series | pl.Expr:
    """True where a matched target value (`old`) and the compute's value (`new`) of one column
    differ: the one definition of "changed" of every Iceberg merge. An upsert or sync rewrites a
    matched row when `values_differ` is true for at least one of its value columns
    (`rows_differ`), and counts it `unchanged` (left where it is) otherwise. Both merge paths
    call it: the key scan column by column (`key_scan.scan_candidates`, cheapest column first),
    the file-by-file fallback over each file's joined rows (`merge.FileMerge.merge_by_frame`).

    Both sides are first cast to the table's column type (`align_to_schema`; the input
    check converts a zoned timestamp to UTC and drops nanoseconds before either arm sees it).
    Then, as polars' `eq_missing` compares:

    - null equals null, and differs from any value (an absent column is null);
    - NaN equals NaN; -0.0 equals 0.0; +inf and -inf equal themselves only; floats are otherwise
      compared exactly (no tolerance);
    - decimals compare by value at the column's scale (`1.50` equals `1.5`);
    - strings compare exactly, byte for byte: `"a "` differs from `"a"` (no trimming, no case
      folding); binary likewise;
    - timestamps with a time zone compare as instants (the table keeps UTC); naive timestamps,
      dates and times as they are, to the microsecond;
    - nested values (lists, structs, fixed arrays) compare element by element with the same rules
      at every depth (NaN equals NaN, -0.0 equals 0.0 inside a list); a null list or struct
      differs from an empty list or a struct whose fields are all null.

    The legacy Postgres arm's twin is SQL: `postgres/staging.py`, `staging.apply_plan`'s upsert
    (`jsonb_strip_nulls(r.data) IS DISTINCT FROM jsonb_strip_nulls(b.data)` over the stored and
    the staged `jsonb` documents, which encode NaN as `"NaN"`, -0.0 as 0 and decimals as exact
    numerics: the same answers; it stores no nested column). A both-arms property test pins the
    two to this definition (`pipeline_output_tests/stores/both_arms/test_changed_rows.py`).
    """
    return ~old.eq_missing(new)


def rows_differ(value_cols: Sequence[str], *, new_prefix: str = NEW_PREFIX) -> pl.Expr:
    """True for the joined rows whose target values (`c`) differ from the compute's
    (`new_prefix + c`) in at least one of `value_cols` (`values_differ`); false when there is
    no value column (a row that is only its key never changes)."""
    return pl.any_horizontal(
        [values_differ(pl.col(c), pl.col(new_prefix + c)) for c in value_cols] or [pl.lit(False)]
    )


def absent_mask(
    rows: pl.DataFrame,
    batch: pl.DataFrame,
    pk: list[str],
    *,
    scope: str,
    inside: pl.Expr | None,
) -> pl.Series | None:
    """Target `rows` a sync deletes: key absent from the compute's keys `batch` (the ones the
    file's bounds admit: no other key can match its rows), and where `inside` (a window's or
    partition slice's predicate over `rows`) is true. None: the write deletes no absent key
    (`scope` none)."""
    if scope == "none":
        return None
    hit = "__po_hit__"
    absent = (
        rows.select(pk)
        .join(
            batch.select(pk).with_columns(pl.lit(True).alias(hit)),
            on=pk,
            how="left",
            nulls_equal=True,
        )[hit]
        .is_null()
    )
    if inside is not None:
        absent = absent & rows.select(inside).to_series()
    return absent


FLUSH_BYTES = 128 * 1024 * 1024


class RewriteSink:
    """Buffers rewritten rows and writes them as data files past `flush_bytes`."""

    def __init__(
        self,
        writer: DataFileWriter | None,
        spec: DatasetSpec,
        *,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self.writer = writer
        self.spec = spec
        self.flush_bytes = flush_bytes
        self.files: list[DataFile] = []
        self._buffer: list[pl.DataFrame] = []
        self._size = 0

    def add(self, frame: pl.DataFrame) -> None:
        """Take the rows of one rewritten file (in the table's columns)."""
        if frame.height == 0:
            return
        self._buffer.append(frame)
        self._size += int(frame.estimated_size())
        if self.writer is not None and self._size >= self.flush_bytes:
            self._flush()

    def rest_height(self) -> int:
        """Rows buffered and not written yet."""
        return sum(f.height for f in self._buffer)

    def rest(self) -> list[pl.DataFrame]:
        """The buffered rows not written yet (the buffer is emptied)."""
        rest, self._buffer, self._size = self._buffer, [], 0
        return rest

    def _flush(self) -> None:
        assert self.writer is not None
        frame = pl.concat(self.rest(), how="vertical", rechunk=True)
        self.files.extend(self.writer.write(sorted_for_write(frame, self.spec)))


def coalesced(frames: list[pl.DataFrame], spec: DatasetSpec) -> list[pl.DataFrame]:
    """The rewritten files' contents and the new rows as ONE frame sorted by the key: the writer
    cuts it into files near the table's target size (and one per partition), so an upsert that
    rewrites k files adds about max(1, touched bytes / target) files instead of k + 1, and a
    table fed by small upserts does not gain a file per write."""
    kept = [f for f in frames if f.height]
    if len(kept) <= 1:
        return kept
    # rechunked: a frame of many chunks is written as as many row groups, and a file rewritten
    # by every small upsert would gain a row group per write
    return [sorted_for_write(pl.concat(kept, how="vertical", rechunk=True), spec)]


@dataclass(frozen=True)
class RowScope:
    """A window over `columns[0]`, or a partition slice over its `columns`."""

    schema: Schema
    columns: tuple[str, ...]
    window: Window | None = None
    partition: PartitionSlice | None = None

    def expr(self, schema: pl.Schema) -> pl.Expr:
        """A predicate true for the rows inside the scope, over rows of `schema` (null values
        are never inside)."""
        if self.partition is not None:
            return self.partition.contains(schema)
        assert self.window is not None
        wm = self.columns[0]
        return self.window.contains(wm, schema[wm]).fill_null(False)

    def mask(self, rows: pl.DataFrame) -> pl.Series:
        """True for the rows inside the scope (null values are never inside)."""
        return rows.select(self.expr(rows.schema)).to_series()

    def relation(self, task: FileScanTask) -> str:
        """`inside`, `outside` or `straddles`: the file's rows against the scope."""
        if self.partition is not None:
            return slice_relation(task, self.schema, self.partition)
        assert self.window is not None
        return window_relation(task, self.schema, self.columns[0], self.window)


def row_scope(plan: WritePlan, spec: DatasetSpec, table_schema: Schema, schema: Schema) -> RowScope:
    """The scope of a plan whose deletes are scoped (`spec.SCOPED`). `table_schema` is the table
    before this write (a window's watermark must be in it), `schema` the one the merge reads."""
    assert plan.delete_scope in SCOPED
    if plan.partition is not None:
        return RowScope(schema, plan.partition.columns, partition=plan.partition)
    wm = spec.watermark
    # the table as it was before this write (a column added now holds no watermarks yet)
    if wm is None or wm not in schema_names(table_schema) or plan.window is None:
        raise BadInput(
            f"dataset {spec.name!r}: a windowed write needs the watermark column {wm!r} in the table"
        )
    return RowScope(schema, (wm,), window=plan.window)
