"""The compute's output as a checked frame: type normalisation and the bad-input checks.

Owns what every arm needs before it writes: turning a polars DataFrame / LazyFrame, a pandas DataFrame
(pandas is never imported here: a pandas frame exists only if the caller imported it) or an Arrow
table into one polars DataFrame with portable types, and refusing (with the dataset's name and the cause)
missing key columns, null keys, duplicate keys (or de-duplicating by `dedupe_by`) and rows outside a
window, duplicate column names, and columns in the stores' reserved namespace (`__po_`...). Pure: no
I/O.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline_output.contract.spec import DatasetSpec, check_identifier
from pipeline_output.contract.windows import Window
from pipeline_output.errors import (
    BadInput,
    DuplicateKeys,
    MissingKeyColumn,
    NullKey,
    RowsOutsideWindow,
)

MAX_EXAMPLES = 5
# Column names the stores use internally (row indexes, merge join columns) all start with this, so
# a user column never collides with them: it is refused up front on both arms (`check_columns`).
RESERVED_PREFIX = "__po_"


@dataclass(frozen=True)
class CheckedInput:
    """A compute's output converted and key-checked once (`checked_input`), so the arms of one
    write (and the Iceberg arm's `prepare`) do not convert and re-check it each."""

    dataset: str
    primary_key: tuple[str, ...]
    dedupe_by: str | None
    frame: pl.DataFrame

    def fits(self, spec: DatasetSpec) -> bool:
        """Whether these checks are the ones `spec` needs (same dataset, key and de-duplication)."""
        return (self.dataset, self.primary_key, self.dedupe_by) == (
            spec.name,
            spec.primary_key,
            spec.dedupe_by,
        )


def checked_input(spec: DatasetSpec, data: Any) -> CheckedInput:
    """Convert and check `data` for `spec` once (a `CheckedInput` that fits is returned as is)."""
    if isinstance(data, CheckedInput) and data.fits(spec):
        return data
    frame = check_keys(spec, to_polars(spec, data))
    return CheckedInput(spec.name, spec.primary_key, spec.dedupe_by, frame)


def checked_frame(spec: DatasetSpec, data: Any) -> pl.DataFrame:
    """The converted, key-checked frame of `data` for `spec` (see `checked_input`)."""
    return checked_input(spec, data).frame


def from_arrow(data: pa.Table | pa.RecordBatch) -> pl.DataFrame:
    """An Arrow table or batch as a polars DataFrame (typed: `pl.from_arrow` may return a Series)."""
    frame = pl.from_arrow(data)
    assert isinstance(frame, pl.DataFrame)
    return frame


def polars_schema(arrow: pa.Schema) -> pl.Schema:
    """The polars schema an Arrow schema reads back as: converted by polars from the schema
    alone (the Arrow C schema interface), the types `pl.from_arrow` gives a table of it —
    without allocating an empty table, whose first Arrow buffers cost a read ~5 MB of RSS."""
    return pl.Schema(arrow)


def to_polars(spec: DatasetSpec, data: Any) -> pl.DataFrame:
    """Collect the compute's output into a polars DataFrame, or raise `BadInput`."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        data = _from_pandas(spec, data)
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        _check_unique_names(spec, list(data.schema.names))
    data = collect_frame(spec, data)
    if isinstance(data, pl.DataFrame):
        frame = data
    elif isinstance(data, (pa.Table, pa.RecordBatch)):
        frame = pl.from_arrow(data)  # type: ignore[assignment]
    else:
        raise BadInput(
            f"dataset {spec.name!r}: the compute returned {type(data).__name__}; expected a polars "
            "DataFrame or LazyFrame, a pandas DataFrame or a pyarrow Table"
        )
    check_columns(spec, frame.columns)
    return _portable_types(spec, frame)


def _from_pandas(spec: DatasetSpec, data: Any) -> pl.DataFrame:
    """A pandas DataFrame as polars: a named index becomes columns (as `reset_index()` makes
    them), an unnamed one is dropped; column names must be unique strings."""
    names = list(data.columns)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise BadInput(
            f"dataset {spec.name!r}: the compute's pandas columns must be named by strings, got "
            f"{', '.join(map(repr, bad[:MAX_EXAMPLES]))} (nothing was written)"
        )
    _check_unique_names(spec, names)
    if any(level is not None for level in data.index.names):
        data = data.reset_index()
    try:
        return pl.from_pandas(data, include_index=False)
    except (pl.exceptions.PolarsError, pa.ArrowException, TypeError, ValueError) as exc:
        raise BadInput(
            f"dataset {spec.name!r}: cannot convert the compute's pandas DataFrame: {exc}"
        ) from exc


def collect_frame(spec: DatasetSpec, data: Any) -> Any:
    """Collect a LazyFrame (its failure is the compute's: `BadInput`); anything else unchanged."""
    if not isinstance(data, pl.LazyFrame):
        return data
    try:
        return data.collect()
    except pl.exceptions.PolarsError as exc:
        raise BadInput(f"dataset {spec.name!r}: the compute's LazyFrame failed: {exc}") from exc


def check_columns(spec: DatasetSpec, columns: list[str]) -> None:
    """Refuse column names that are not identifiers (`InvalidSpec`) or are reserved (`BadInput`)."""
    for col in columns:
        check_identifier(col, what="column", dataset=spec.name)
    reserved = [c for c in columns if c.startswith(RESERVED_PREFIX)]
    if reserved:
        raise BadInput(
            f"dataset {spec.name!r}: column(s) {', '.join(map(repr, reserved))} use the reserved "
            f"prefix {RESERVED_PREFIX!r} (the stores' internal row-index and merge columns); "
            "rename them (nothing was written)"
        )


def _check_unique_names(spec: DatasetSpec, names: list[str]) -> None:
    """An Arrow table may repeat a column name; a dataset cannot (which column would be stored?)."""
    dupes = sorted(name for name, n in Counter(names).items() if n > 1)
    if dupes:
        raise BadInput(
            f"dataset {spec.name!r}: the compute's output has duplicate column name(s) "
            f"{', '.join(map(repr, dupes))}; each column needs a unique name (nothing was written)"
        )


def _portable_types(spec: DatasetSpec, frame: pl.DataFrame) -> pl.DataFrame:
    """Map types Iceberg lacks onto ones it has (categoricals -> strings, small ints -> int32...)."""
    casts: dict[str, pl.DataType | type[pl.DataType]] = {}
    for name, dtype in frame.schema.items():
        if isinstance(dtype, (pl.Categorical, pl.Enum)):
            casts[name] = pl.String
        elif dtype in (pl.Int8, pl.Int16, pl.UInt8, pl.UInt16):
            casts[name] = pl.Int32
        elif dtype == pl.UInt32 or dtype == pl.UInt64:
            casts[name] = pl.Int64
        elif isinstance(dtype, pl.Datetime) and (
            dtype.time_unit == "ns" or dtype.time_zone not in (None, "UTC")
        ):
            # Iceberg's timestamptz is UTC; convert (the instant is kept), and drop nanoseconds
            zone = "UTC" if dtype.time_zone is not None else None
            if dtype.time_zone not in (None, "UTC"):
                frame = frame.with_columns(pl.col(name).dt.convert_time_zone("UTC"))
            casts[name] = pl.Datetime("us", zone)
        elif isinstance(dtype, pl.Time):
            # polars keeps nanoseconds, Iceberg's and Postgres' `time` microseconds: truncate
            # here, so both arms store the same value and an unchanged row compares equal
            frame = frame.with_columns((pl.col(name).cast(pl.Int64) // 1000 * 1000).cast(pl.Time))
        elif isinstance(dtype, (pl.Duration, pl.Object)):
            how = (  # Iceberg has no interval type: a count of a unit is what engines share
                f"store it as a number, e.g. pl.col({name!r}).dt.total_microseconds()"
                if isinstance(dtype, pl.Duration)
                else "convert it to a string, a number or a struct"
            )
            raise BadInput(
                f"dataset {spec.name!r}: column {name!r} has type {dtype}, which Iceberg cannot "
                f"store: {how}"
            )
    if not casts:
        return frame
    try:
        return frame.with_columns(
            [pl.col(name).cast(dtype, strict=True) for name, dtype in casts.items()]
        )
    except pl.exceptions.PolarsError as exc:
        raise BadInput(f"dataset {spec.name!r}: cannot convert column types: {exc}") from exc


def check_keys(spec: DatasetSpec, frame: pl.DataFrame) -> pl.DataFrame:
    """Apply the key checks; returns the frame (de-duplicated when `dedupe_by` says so)."""
    pk = list(spec.primary_key)
    if pk:
        missing = [c for c in pk if c not in frame.columns]
        if missing:
            raise MissingKeyColumn(
                f"dataset {spec.name!r}: primary-key column(s) {missing} missing from the compute's "
                f"output (columns: {frame.columns})"
            )
        nulls = [c for c in pk if frame[c].null_count() > 0]
        if nulls:
            raise NullKey(
                f"dataset {spec.name!r}: primary-key column(s) {nulls} contain nulls "
                f"({sum(frame[c].null_count() for c in nulls)} rows)"
            )
        if spec.dedupe_by is not None:
            if spec.dedupe_by not in frame.columns:
                raise BadInput(
                    f"dataset {spec.name!r}: dedupe_by column {spec.dedupe_by!r} is not in the output"
                )
            frame = (
                frame.with_row_index("__po_order__")
                .sort([spec.dedupe_by, "__po_order__"], nulls_last=False)
                .unique(subset=pk, keep="last", maintain_order=True)
                .sort("__po_order__")
                .drop("__po_order__")
            )
        if len(pk) == 1:
            distinct = frame.get_column(pk[0]).n_unique()
        else:
            distinct = frame.select(pl.struct(pk).n_unique()).item()
        if distinct == frame.height:
            return frame  # the cheap test: no duplicates (the group-by below only finds examples)
        # the count's name is reserved: a key column may be called "len"
        dupes = frame.group_by(pk).len(name="__po_len__").filter(pl.col("__po_len__") > 1)
        if dupes.height:
            examples = dupes.head(MAX_EXAMPLES).select(pk).rows()
            shown = ", ".join(repr(row[0] if len(row) == 1 else row) for row in examples)
            raise DuplicateKeys(
                f"dataset {spec.name!r}: {dupes.height} primary key(s) appear more than once in the "
                f"compute's output, e.g. {shown} (set dedupe_by=<column> to keep the last row per key)"
            )
    return frame


def duplicate_target_keys(spec: DatasetSpec, count: int, examples: list[Any]) -> DuplicateKeys:
    """The refusal of a matching write whose target already holds some of its keys more than once
    (rows written by another tool, or under `append_always`): which row would it update?"""
    shown = ", ".join(repr(k) for k in examples[:MAX_EXAMPLES])
    return DuplicateKeys(
        f"dataset {spec.name!r}: the target already holds {count} of this write's primary key(s) "
        f"more than once, e.g. {shown}, so a matching write cannot tell which row to update; "
        "nothing was written. Remove the duplicate rows first (a full `replace` re-deploy does)"
    )


def refuse_duplicate_matches(spec: DatasetSpec, matched: pl.DataFrame) -> None:
    """`matched` holds the primary key of every target row a write matched, one row per target
    row; refuse (`duplicate_target_keys`) when a key appears twice."""
    pk = list(spec.primary_key)
    if matched.height == 0 or matched.select(pl.struct(pk).n_unique()).item() == matched.height:
        return
    dupes = matched.group_by(pk).len(name="__po_len__").filter(pl.col("__po_len__") > 1)
    rows = dupes.sort(pk).select(pk).rows()
    raise duplicate_target_keys(spec, dupes.height, [r[0] if len(r) == 1 else r for r in rows])


def check_in_window(spec: DatasetSpec, frame: pl.DataFrame, window: Window) -> None:
    """Refuse rows whose watermark lies outside `window` (for writes that replace inside it)."""
    if spec.watermark is None or spec.watermark not in frame.columns:
        raise MissingKeyColumn(
            f"dataset {spec.name!r}: a windowed {spec.strategy} write needs the watermark column "
            f"{spec.watermark!r} in the compute's output"
        )
    if not frame.height:
        return
    dtype = frame.schema.get(spec.watermark)
    outside = frame.filter(~window.contains(spec.watermark, dtype).fill_null(False))
    if outside.height:
        sample = outside[spec.watermark].head(MAX_EXAMPLES).to_list()
        raise RowsOutsideWindow(
            f"dataset {spec.name!r}: {outside.height} row(s) have {spec.watermark} outside "
            f"the window {window}, e.g. {sample}"
        )
