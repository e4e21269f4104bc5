"""The target rows a scoped write may delete — a delta window of the watermark column, or a Dagster
partition's slice — as a mask over rows read from a data file and as a file's relation to it from
its column bounds (`inside` files are dropped whole, `outside` ones are not read at all).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask

from pipeline_output.contract.plan import SCOPED, WritePlan
from pipeline_output.contract.slices import PartitionSlice
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.errors import BadInput
from pipeline_output.stores.iceberg.table.expressions import slice_relation, window_relation
from pipeline_output.stores.iceberg.write.frame_rows import schema_names


@dataclass(frozen=True)
class RowScope:
    """A window over `columns[0]`, or a partition slice over its `columns`."""

    schema: Schema
    columns: tuple[str, ...]
    window: Window | None = None
    partition: PartitionSlice | None = None

    def mask(self, rows: pl.DataFrame) -> pl.Series:
        """True for the rows inside the scope (null values are never inside)."""
        if self.partition is not None:
            return rows.select(self.partition.contains(rows.schema)).to_series()
        assert self.window is not None
        wm = self.columns[0]
        return rows.select(self.window.contains(wm, rows.schema[wm]).fill_null(False)).to_series()

    def relation(self, task: FileScanTask) -> str:
        """`inside`, `outside` or `straddles`: the file's rows against the scope."""
        if self.partition is not None:
            return slice_relation(task, self.schema, self.partition)
        assert self.window is not None
        return window_relation(task, self.schema, self.columns[0], self.window)


def row_scope(plan: WritePlan, spec: DatasetSpec, table_schema: Schema, schema: Schema) -> RowScope:
    """The scope of a plan whose deletes are scoped (`plan.SCOPED`). `table_schema` is the table
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
