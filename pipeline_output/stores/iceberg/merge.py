"""The file-level copy-on-write merges behind replace (windowed), append_new, upsert and sync:
file statistics prune the candidate files, the key columns verify them, and only files that
really change are rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import polars as pl
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import (
    AlwaysTrue,
)
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.types import NestedField, PrimitiveType

from pipeline_output.errors import (
    BadInput,
)
from pipeline_output.frames import from_arrow, refuse_duplicate_matches
from pipeline_output.plan import WritePlan
from pipeline_output.spec import DatasetSpec
from pipeline_output.stores.iceberg.expressions import _physical, _window_relation
from pipeline_output.stores.iceberg.manifests import ManifestIndex
from pipeline_output.stores.iceberg.partitions import key_partition_values
from pipeline_output.stores.iceberg.prewrite import _Changes
from pipeline_output.stores.iceberg.properties import _NEW, _POS, _READ_THREADS
from pipeline_output.stores.iceberg.rows import (
    _align,
    _differs,
    _read_local,
    _replace_rows,
    _schema_names,
    _sorted,
    _total_records,
)
from pipeline_output.windows import Window

# -- the merges ------------------------------------------------------------------------------


@dataclass
class _Merge:
    """Decides, file by file, what a write mode changes in an existing table."""

    table: Table
    tx: Transaction
    spec: DatasetSpec
    frame: pl.DataFrame
    schema: Schema
    index: ManifestIndex

    def run(self, plan: WritePlan) -> _Changes:
        handlers: dict[str, Callable[[WritePlan], _Changes]] = {
            "replace": self._replace,
            "append": self._append,
            "append_new": self._append_new,
            "upsert": self._upsert_or_sync,
            "sync": self._upsert_or_sync,
        }
        return handlers[plan.write_mode](plan)

    # -- simple modes

    def _append(self, plan: WritePlan) -> _Changes:
        total = _total_records(self.table)
        return _Changes(new_frames=[self.frame], inserted=self.frame.height, preserved=total)

    def _replace(self, plan: WritePlan) -> _Changes:
        tasks = self._tasks()
        if plan.delete_scope == "all" or plan.window is None:
            deleted = sum(t.file.record_count for t in tasks)
            return _Changes(
                deleted_files=[t.file for t in tasks],
                new_frames=[self.frame],
                inserted=self.frame.height,
                deleted=deleted,
            )
        # Rows inside the window are replaced. For a keyed dataset a computed key that exists
        # outside the window (its row moved into this window) is replaced too: keys stay unique.
        window, wm = plan.window, self._watermark()
        pk = list(self.spec.primary_key)
        by_key = {id(t) for t in self._prune_by_keys(tasks)} if pk else set()
        changes = _Changes(new_frames=[self.frame], inserted=self.frame.height)
        straddling: list[FileScanTask] = []
        for task in tasks:
            relation = _window_relation(task, self.schema, wm, window)
            if relation == "outside" and id(task) not in by_key:
                changes.preserved += task.file.record_count
            elif relation == "inside" and not task.delete_files:
                changes.deleted_files.append(task.file)
                changes.deleted += task.file.record_count
            else:
                straddling.append(task)
        keys = self.frame.select(pk).with_columns(pl.lit(True).alias("__po_hit__")) if pk else None
        for task, rows in zip(straddling, self._read(straddling), strict=True):
            drop = rows.select(window.contains(wm, rows.schema[wm]).fill_null(False)).to_series()
            if keys is not None:
                hit = rows.select(pk).join(keys, on=pk, how="left", nulls_equal=True)
                drop = drop | hit.get_column("__po_hit__").is_not_null()
            n_drop = int(drop.sum())
            if n_drop == 0:
                changes.preserved += rows.height
                continue
            kept = rows.filter(~drop)
            changes.deleted_files.append(task.file)
            changes.deleted += n_drop
            changes.preserved += kept.height
            changes.new_frames.append(_sorted(kept, self.spec))
        return changes

    def _append_new(self, plan: WritePlan) -> _Changes:
        pk = list(self.spec.primary_key)
        candidates = self._prune_by_keys(self._tasks())
        existing = self._read(candidates, columns=pk)
        keys = pl.concat(existing) if existing else self.frame.head(0).select(pk)
        fresh = self.frame.join(keys, on=pk, how="anti", nulls_equal=True)
        skipped = self.frame.height - fresh.height
        if skipped == 0:
            fresh = self.frame  # written as it is (its files may already exist: see _Prewritten)
        total = _total_records(self.table)
        return _Changes(
            new_frames=[fresh], inserted=fresh.height, skipped=skipped, preserved=total - skipped
        )

    # -- the copy-on-write merge behind upsert and sync

    def _upsert_or_sync(self, plan: WritePlan) -> _Changes:
        spec, frame = self.spec, self.frame
        pk = list(spec.primary_key)
        scope = plan.delete_scope  # none | absent_keys | absent_keys_in_window
        window = plan.window if scope == "absent_keys_in_window" else None
        wm = self._watermark() if window is not None else None
        tasks = self._tasks()
        if scope == "absent_keys":
            candidates = tasks
        elif window is not None and wm is not None:
            by_key = {id(t) for t in self._prune_by_keys(tasks)}
            candidates = [
                t
                for t in tasks
                if id(t) in by_key or _window_relation(t, self.schema, wm, window) != "outside"
            ]
        else:
            candidates = self._prune_by_keys(tasks)
        changes = _Changes()
        chosen = {id(t) for t in candidates}
        changes.preserved += sum(t.file.record_count for t in tasks if id(t) not in chosen)
        # each file is joined only with the compute's rows its key bounds admit
        slices = _KeySlices(frame, pk[0], self.table.schema())

        # Key pass: with several candidates, read only keys (+ watermark) to find files that change.
        if len(candidates) > 1:
            cols = pk + ([wm] if wm else [])
            key_frames = self._read(candidates, columns=cols)
            relevant = []
            for task, keys in zip(candidates, key_frames, strict=True):
                batch = slices.of(task).select(pk)
                matched = keys.join(batch, on=pk, how="semi", nulls_equal=True).height
                absent = self._absent(keys, batch, scope, window, wm)
                if matched or absent:
                    relevant.append(task)
                else:
                    changes.preserved += keys.height
            candidates = relevant

        matched_keys: list[pl.DataFrame] = []
        value_cols = [c for c in _schema_names(self.schema) if c not in pk]
        # the compute's value columns under reserved names: no user column can collide with them
        renamed = {c: _NEW + c for c in frame.columns if c not in pk}
        for task, rows in zip(candidates, self._read(candidates), strict=True):
            rows = rows.with_row_index(_POS)
            batch = slices.of(task)
            joined = rows.join(batch.rename(renamed), on=pk, how="inner", nulls_equal=True)
            if joined.height:
                matched_keys.append(joined.select(pk))
            changed = joined.filter(_differs(joined, value_cols))
            absent_mask = self._absent_mask(rows, batch.select(pk), scope, window, wm)
            n_absent = int(absent_mask.sum()) if absent_mask is not None else 0
            if changed.height == 0 and n_absent == 0:
                changes.unchanged += joined.height
                changes.preserved += rows.height - joined.height
                continue
            content = _replace_rows(rows, changed, value_cols, pk)
            if absent_mask is not None:
                content = content.filter(~absent_mask)
            content = content.drop(_POS)
            changes.deleted_files.append(task.file)
            changes.new_frames.append(content)
            changes.updated += changed.height
            changes.unchanged += joined.height - changed.height
            changes.deleted += n_absent
            changes.preserved += rows.height - joined.height - n_absent

        all_matched = pl.concat(matched_keys) if matched_keys else frame.head(0).select(pk)
        refuse_duplicate_matches(spec, all_matched)  # before anything is committed
        inserts = frame.join(all_matched, on=pk, how="anti", nulls_equal=True)
        if inserts.height:
            changes.new_frames.append(inserts)
            changes.inserted = inserts.height
        changes.new_frames = _coalesced(changes.new_frames, self.spec)
        return changes

    def _absent_mask(
        self,
        rows: pl.DataFrame,
        batch: pl.DataFrame,
        scope: str,
        window: Window | None,
        wm: str | None,
    ) -> pl.Series | None:
        """Target rows a sync deletes: key absent from the compute's keys `batch` (the ones the
        file's bounds admit: no other key can match its rows), and inside the window."""
        if scope == "none":
            return None
        pk = list(self.spec.primary_key)
        absent = (
            rows.select(pk)
            .join(
                batch.select(pk).with_columns(pl.lit(True).alias("__po_hit__")),
                on=pk,
                how="left",
                nulls_equal=True,
            )["__po_hit__"]
            .is_null()
        )
        if window is not None and wm is not None:
            absent = (
                absent
                & rows.select(window.contains(wm, rows.schema[wm]).fill_null(False)).to_series()
            )
        return absent

    def _absent(
        self,
        keys: pl.DataFrame,
        batch: pl.DataFrame,
        scope: str,
        window: Window | None,
        wm: str | None,
    ) -> int:
        mask = self._absent_mask(keys, batch, scope, window, wm)
        return int(mask.sum()) if mask is not None else 0

    # -- file planning and reading

    def _tasks(self) -> list[FileScanTask]:
        return self.index.tasks()

    def _watermark(self) -> str:
        wm = self.spec.watermark
        # the table as it was before this write (a column added now holds no watermarks yet)
        if wm is None or wm not in _schema_names(self.table.schema()):
            raise BadInput(
                f"dataset {self.spec.name!r}: a windowed write needs the watermark column "
                f"{wm!r} in the table"
            )
        return wm

    def _prune_by_keys(self, tasks: list[FileScanTask]) -> list[FileScanTask]:
        """Files whose partition (when the table is partitioned by a key column) and key
        statistics admit at least one of the compute's keys: a matching row has every key
        column inside the file's bounds, so each key column prunes (composite keys too)."""
        if not tasks or self.frame.height == 0:
            return []
        tasks = self._prune_by_partition(tasks)
        schema = self.table.schema()
        columns = []
        for name in self.spec.primary_key:
            field = schema.find_field(name)
            if isinstance(field.field_type, PrimitiveType):
                values = _physical(self.frame.get_column(name), field.field_type)
                columns.append((field, values.unique().sort()))
        admitted = [True] * len(tasks)
        for field, keys in columns:
            admitted = [
                a and b for a, b in zip(admitted, _admits_all(tasks, field, keys), strict=True)
            ]
        return [t for t, ok in zip(tasks, admitted, strict=True) if ok]

    def _prune_by_partition(self, tasks: list[FileScanTask]) -> list[FileScanTask]:
        """Drop files of the current spec whose partition no key of the compute falls in."""
        metadata = self.table.metadata
        wanted = key_partition_values(self.spec, metadata, self.frame)
        if wanted is None:
            return tasks
        current = metadata.default_spec_id
        return [
            t
            for t in tasks
            if t.file.spec_id != current
            or all(t.file.partition[i] in values for i, values in wanted.items())
        ]

    def _read(
        self, tasks: list[FileScanTask], *, columns: Sequence[str] | None = None
    ) -> list[pl.DataFrame]:
        """Read each task into its own frame (all columns of the current schema, or `columns`)."""
        if not tasks:
            return []
        read_schema = self.table.schema()
        if columns is not None:
            read_schema = read_schema.select(*columns)

        def one(task: FileScanTask) -> pl.DataFrame:
            fast = _read_local(task, read_schema)
            if fast is None:
                scan = ArrowScan(self.table.metadata, self.table.io, read_schema, AlwaysTrue())
                fast = from_arrow(scan.to_table([task]))
            return _align(fast, self.schema, only=columns)

        if len(tasks) == 1:
            return [one(tasks[0])]
        with ThreadPoolExecutor(max_workers=min(_READ_THREADS, len(tasks))) as pool:
            return list(pool.map(one, tasks))


def _coalesced(frames: list[pl.DataFrame], spec: DatasetSpec) -> list[pl.DataFrame]:
    """The rewritten files' contents and the inserted rows as ONE frame sorted by the key: the
    writer cuts it into files near the table's target size (and one per partition), so an upsert
    that rewrites k files adds about max(1, touched bytes / target) files instead of k + 1, and a
    table fed by small upserts does not gain a file per write."""
    kept = [f for f in frames if f.height]
    if len(kept) <= 1:
        return kept
    frames.clear()
    # rechunked: a frame of many chunks is written as as many row groups, and a file rewritten
    # by every small upsert would gain a row group per write
    return [_sorted(pl.concat(kept, how="vertical", rechunk=True), spec)]


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


def _admits_all(tasks: list[FileScanTask], field: NestedField, keys: pl.Series) -> list[bool]:
    """For each file: whether one of the sorted `keys` lies within its bounds of `field` (True when
    the file has no bounds for it, or they cannot be compared). One vectorised search over every
    file's bounds: the cost stays small when the table has thousands of files."""
    bounds = [_decoded_bounds(task, field) for task in tasks]
    try:
        lo = pl.Series([b[0] if b else None for b in bounds], dtype=keys.dtype, strict=True)
        hi = pl.Series([b[1] if b else None for b in bounds], dtype=keys.dtype, strict=True)
        i = keys.search_sorted(lo, side="left")
        j = keys.search_sorted(hi, side="right")
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return [True] * len(tasks)
    missing = lo.is_null() | hi.is_null()
    return (missing | (j > i)).to_list()


class _KeySlices:
    """The compute's rows a file's bounds of the first key column admit (a row of the file can
    only match those): each file is joined with its slice instead of the whole batch, so a merge
    over many files costs about files + batch rows, not files x batch rows."""

    def __init__(self, frame: pl.DataFrame, column: str, schema: Schema) -> None:
        self.frame = frame
        self.field = schema.find_field(column)
        self.sorted: pl.Series | None = None
        if isinstance(self.field.field_type, PrimitiveType) and frame.height > 1:
            values = _physical(frame.get_column(column), self.field.field_type)
            self.order = values.arg_sort()
            self.sorted = values.gather(self.order)

    def of(self, task: FileScanTask) -> pl.DataFrame:
        bounds = _decoded_bounds(task, self.field)
        if self.sorted is None or bounds is None:
            return self.frame
        try:
            i = int(self.sorted.search_sorted(bounds[0], side="left"))
            j = int(self.sorted.search_sorted(bounds[1], side="right"))
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            return self.frame
        if i == 0 and j == self.frame.height:
            return self.frame
        return self.frame[self.order.slice(i, max(j - i, 0))]
