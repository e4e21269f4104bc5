"""The legacy arm's types: Postgres types of polars columns, schema evolution by the native
arm's rules, and preparing a frame for COPY (text checks, key length).

The JSON encoding (what makes `read` an exact, typed round trip):

- each document has one key per registered column (missing key == null; older rows may lack a
  column added later); SQL NULL is JSON `null`;
- integers and decimals are JSON numbers (jsonb stores them as exact `numeric`; decimals keep
  their scale, e.g. `1.50`);
- finite floats are JSON numbers in shortest round-trip form; NaN, +inf and -inf are the strings
  `"NaN"`, `"Infinity"`, `"-Infinity"` (Postgres' own jsonb rendering of float8 specials). `-0.0`
  reads back as `0.0` (jsonb numerics have no negative zero);
- timestamps are ISO-8601 strings: naive ones without offset (`2024-01-01T12:00:00.123456`),
  tz-aware ones in UTC with `+00:00` (tz-aware columns are UTC, as in the native arm); dates are
  `YYYY-MM-DD`; booleans are JSON booleans; strings are JSON strings; binary is `"\\x<hex>"`.

`read` restores the registered Arrow schema: each value is cast in SQL from its JSON text to the
column's Postgres type and streamed back as Arrow (ADBC), then cast to the registered polars type.
The primary key is stored canonically in `pk`: the key's text for one key column
(`data->>'id'`), the JSON array of the key values for a composite key (`["a", 2]`), NULL when the
dataset has no key. Key matching compares `pk`; "unchanged" compares documents with nulls stripped,
so NaN equals NaN and null equals null (or a missing key), as in the native arm. Nested column
types (lists, structs) are not stored by this arm yet (`BadInput`).
"""

from __future__ import annotations

import polars as pl
import psycopg
import pyarrow as pa
from psycopg import sql
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import NestedField

from pipeline_output.contract.checked_input import polars_schema
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import (
    BadInput,
    SchemaMismatch,
)
from pipeline_output.stores.postgres.fragments import BTREE_MAX_BYTES
from pipeline_output.stores.schema import arrow_schema_of, plan_evolution

# -- types ------------------------------------------------------------------------------------


_SIMPLE_TYPES: dict[type[pl.DataType], str] = {
    pl.Int32: "integer",
    pl.Int64: "bigint",
    pl.Float32: "real",
    pl.Float64: "double precision",
    pl.Boolean: "boolean",
    pl.String: "text",
    pl.Binary: "bytea",
    pl.Date: "date",
    pl.Time: "time",  # microseconds, as Iceberg's `time` (`frames` truncates nanoseconds)
}
# What the arm's capabilities declare (`staging.LEGACY_CAPABILITIES`, beside its write modes):
MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: longer column names would be truncated
# Postgres allows 1,600 columns in a table; the staging table adds its row index.
MAX_COLUMNS = 1600 - 1
# a typeless null column (polars `Null`) takes the registered type, or text when new
SCALAR_TYPES: tuple[type[pl.DataType], ...] = (*_SIMPLE_TYPES, pl.Datetime, pl.Decimal, pl.Null)


def staged_type(spec_name: str, column: str, dtype: pl.DataType) -> sql.Composable:
    """The Postgres column type a polars dtype is staged as (and cast back from on read)."""
    for kind, name in _SIMPLE_TYPES.items():
        if isinstance(dtype, kind):
            return sql.SQL(name)  # type: ignore[arg-type,unused-ignore]  # closed set of names
    if isinstance(dtype, pl.Datetime):
        return sql.SQL("timestamptz" if dtype.time_zone else "timestamp")
    if isinstance(dtype, pl.Decimal):
        if dtype.precision is None:
            return sql.SQL("numeric")
        return sql.SQL("numeric({}, {})").format(
            sql.Literal(int(dtype.precision)), sql.Literal(int(dtype.scale))
        )
    raise BadInput(
        f"dataset {spec_name!r}: column {column!r} has type {dtype}, which the legacy Postgres arm "
        "does not store (supported: integers, floats, decimals, booleans, strings, binary, dates, "
        "times, timestamps)"
    )


def legacy_polars_schema(arrow: pa.Schema) -> dict[str, pl.DataType]:
    return dict(polars_schema(arrow))


def _iceberg_arrow(schema: Schema) -> pa.Schema:
    """The Arrow schema the native arm reads a table of `schema` back as (ids stripped)."""
    arrow: pa.Schema = schema.as_arrow()
    return pa.schema([f.remove_metadata() for f in arrow])


def evolve_schema(
    spec: DatasetSpec, registered: pa.Schema | None, frame: pl.DataFrame
) -> pa.Schema:
    """The dataset's schema after this write, by the native arm's rules (Iceberg types)."""
    try:
        if registered is None:
            # a typeless (all-null) column is created as a string column, as in the native arm
            nulls = [c for c, t in frame.schema.items() if t == pl.Null]
            typed = (
                frame.with_columns([pl.col(c).cast(pl.String) for c in nulls]) if nulls else frame
            )
            fresh = assign_fresh_schema_ids(
                Catalog._convert_schema_if_needed(arrow_schema_of(typed))
            )
            return _iceberg_arrow(fresh)
        current = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(registered))
        evolution = plan_evolution(spec, current, frame)
        if evolution.empty:
            return registered
        widen = dict(evolution.widen)
        fields = [
            NestedField(f.field_id, f.name, widen.get(f.name, f.field_type), required=False)
            for f in current.fields
        ]
        next_id = current.highest_field_id + 1
        for offset, (name, new_type) in enumerate(evolution.add):
            fields.append(NestedField(next_id + offset, name, new_type, required=False))
        return _iceberg_arrow(assign_fresh_schema_ids(Schema(*fields)))
    except SchemaMismatch:
        raise
    except (TypeError, ValueError) as exc:  # pyiceberg: an unsupported type (a non-UTC zone)
        raise SchemaMismatch(f"dataset {spec.name!r}: {exc} (nothing was written)") from exc


def align_to_types(
    spec: DatasetSpec, frame: pl.DataFrame, target: dict[str, pl.DataType]
) -> pl.DataFrame:
    """`frame` with exactly the registered columns, in order, cast to their types (missing: null)."""
    exprs = []
    for name, dtype in target.items():
        if name in frame.columns:
            col = pl.col(name)
            exprs.append(col if frame.schema[name] == dtype else col.cast(dtype, strict=True))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    try:
        return frame.select(exprs)
    except pl.exceptions.PolarsError as exc:
        raise SchemaMismatch(
            f"dataset {spec.name!r}: cannot cast the compute to the registered schema: {exc}"
        ) from exc


def csv_ready(frame: pl.DataFrame) -> pl.DataFrame:
    """Binary columns as Postgres bytea hex text (`\\x...`); everything else as polars writes it."""
    binary = [n for n, t in frame.schema.items() if isinstance(t, pl.Binary)]
    if not binary:
        return frame
    return frame.with_columns(
        [pl.concat_str(pl.lit("\\x"), pl.col(n).bin.encode("hex")).alias(n) for n in binary]
    )


def check_text(spec: DatasetSpec, frame: pl.DataFrame) -> None:
    """Refuse NUL characters in string columns: Postgres text (and jsonb) cannot hold U+0000."""
    strings = [n for n, t in frame.schema.items() if isinstance(t, pl.String)]
    if not strings or not frame.height:
        return
    has_nul = frame.select([pl.col(n).str.contains("\x00", literal=True).any() for n in strings])
    bad = [n for n, flag in zip(strings, has_nul.row(0), strict=True) if flag]
    if bad:
        raise BadInput(
            f"dataset {spec.name!r}: string column(s) {', '.join(map(repr, bad))} contain NUL "
            "characters (\\x00), which Postgres text cannot store; strip them in the compute or "
            "keep the dataset on the iceberg arm (nothing was written)"
        )


def raise_if_key_too_long(spec: DatasetSpec, frame: pl.DataFrame, exc: psycopg.Error) -> None:
    """An index-entry limit hit while writing the key index is the key's length: say so."""
    message = exc.diag.message_primary or ""
    if not spec.primary_key or "index row" not in message:
        return
    sizes = [
        pl.col(c).str.len_bytes() if isinstance(t, pl.String) else pl.col(c).bin.size()
        for c, t in frame.schema.items()
        if c in spec.primary_key and isinstance(t, (pl.String, pl.Binary))
    ]
    longest = ""
    if sizes and frame.height:
        size = frame.select(pl.max_horizontal(sizes).max()).item()
        longest = f"; the longest key value here is {size} bytes"
    raise BadInput(
        f"dataset {spec.name!r}: a value of primary-key column(s) "
        f"{', '.join(map(repr, spec.primary_key))} is too long for the legacy Postgres arm's key "
        f"index (Postgres btree entries are limited to {BTREE_MAX_BYTES} bytes after "
        f"compression{longest}; {message}); shorten or hash the key, or keep the dataset on the "
        "iceberg arm (nothing was written)"
    ) from exc
