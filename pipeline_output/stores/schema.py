"""Iceberg schema handling for the native arm: the initial schema, and reconciling a compute with it.

Owns type mapping between polars/Arrow and Iceberg: the create-time schema (primary key = required
identifier fields, sort order on the key), and on re-deploys the evolution rules — new columns are
added, types widen where Iceberg allows it (int->long, float->double, decimal precision; not a
primary-key column's), dropped columns stay (null in new rows), anything else is a
`SchemaMismatch` naming the column, both types and the documented way forward
(`TYPE_CHANGE_DOC`, docs/concepts.md "Changing a column type"). Pure apart from the
`UpdateSchema` it is handed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    PrimitiveType,
    StringType,
    StructType,
)

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import BadInput, SchemaMismatch

# where a refused type change points (the options: a cast, a new column, a rebuild)
TYPE_CHANGE_DOC = "see docs/concepts.md#changing-a-column-type"


def arrow_schema_of(frame: pl.DataFrame) -> pa.Schema:
    """The Arrow schema polars produces for `frame` (large strings, microsecond timestamps), with
    polars' nanosecond `time64[ns]` as Iceberg's microsecond `time` (`frames` truncates values)."""
    schema = frame.head(0).to_arrow().schema
    return pa.schema([f.with_type(_microsecond_times(f.type)) for f in schema], schema.metadata)


def _microsecond_times(t: pa.DataType) -> pa.DataType:
    """`t` with every `time64[ns]` in it (nested ones too) as `time64[us]`."""
    if pa.types.is_time64(t):
        return pa.time64("us")
    if pa.types.is_struct(t):
        return pa.struct(
            [t.field(i).with_type(_microsecond_times(t.field(i).type)) for i in range(t.num_fields)]
        )
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_microsecond_times(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_microsecond_times(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_microsecond_times(t.value_type)), t.list_size)
    return t


def iceberg_types_of(arrow: pa.Schema, names: Iterable[str]) -> dict[str, IcebergType]:
    """The Iceberg types of the Arrow fields `names` (ids unassigned), converted together: one
    conversion (pyiceberg reads its configuration for each) for all of them, not one a column."""
    wanted = list(names)
    if not wanted:
        return {}
    converted = Catalog._convert_schema_if_needed(pa.schema([arrow.field(n) for n in wanted]))
    # by position: the converted fields carry no ids yet, so a lookup by name is ambiguous
    return {n: f.field_type for n, f in zip(wanted, converted.fields, strict=True)}


def initial_schema(spec: DatasetSpec, frame: pl.DataFrame) -> tuple[Schema, SortOrder]:
    """The create-time schema (primary key required + identifier fields) and sort order.

    A column of polars' `Null` type (no values, no type) is created as a string column.
    """
    nulls = [c for c, t in frame.schema.items() if t == pl.Null]
    if nulls:
        frame = frame.with_columns([pl.col(c).cast(pl.String) for c in nulls])
    arrow = arrow_schema_of(frame)
    pk = set(spec.primary_key)
    arrow = pa.schema(
        [f.with_nullable(False) if f.name in pk else f for f in arrow], metadata=arrow.metadata
    )
    fresh = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow))
    ids = [fresh.find_field(col).field_id for col in spec.primary_key]
    schema = Schema(*fresh.fields, identifier_field_ids=ids)
    sort_cols = [c for c in spec.sort_columns if c in frame.columns]
    order = (
        SortOrder(
            *[
                SortField(
                    source_id=schema.find_field(col).field_id,
                    transform=IdentityTransform(),
                    direction=SortDirection.ASC,
                    null_order=NullOrder.NULLS_FIRST,
                )
                for col in sort_cols
            ]
        )
        if sort_cols
        else SortOrder()
    )
    return schema, order


@dataclass
class Evolution:
    """Schema changes a compute needs: columns to add, types to widen."""

    add: list[tuple[str, IcebergType]] = field(default_factory=list)
    widen: list[tuple[str, PrimitiveType]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Whether the table schema already fits."""
        return not self.add and not self.widen


def canonical_type(t: IcebergType) -> str:
    """A type's shape without field ids (nested types compare by names, types and required-ness)."""
    if isinstance(t, ListType):
        return f"list<{canonical_type(t.element_type)}{'!' if t.element_required else ''}>"
    if isinstance(t, MapType):
        return (
            f"map<{canonical_type(t.key_type)},{canonical_type(t.value_type)}"
            f"{'!' if t.value_required else ''}>"
        )
    if isinstance(t, StructType):
        inner = ",".join(
            f"{f.name}:{canonical_type(f.field_type)}{'!' if f.required else ''}" for f in t.fields
        )
        return f"struct<{inner}>"
    return str(t)


def _widens_to(source: IcebergType, target: IcebergType) -> bool:
    """Whether values of `source` can be written into a `target` column without loss."""
    if source == target or canonical_type(source) == canonical_type(target):
        return True
    if (
        isinstance(source, (ListType, MapType, StructType))
        and type(source) is type(target)
        and canonical_type(source).replace("!", "") == canonical_type(target).replace("!", "")
    ):
        return True  # nested required-ness differs only: polars' Arrow output is all-nullable
    if isinstance(source, IntegerType) and isinstance(target, LongType):
        return True
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return True
    return (
        isinstance(source, DecimalType)
        and isinstance(target, DecimalType)
        and source.scale == target.scale
        and source.precision <= target.precision
    )


_PLANNED: dict[tuple[object, ...], Evolution] = {}  # plan_evolution's results, by their inputs
_PLANNED_MAX = 256


def plan_evolution(spec: DatasetSpec, table_schema: Schema, frame: pl.DataFrame) -> Evolution:
    """Compare the compute's columns with the table's; raise `SchemaMismatch` when they cannot fit.

    Planned once per table schema (its id and fields) and frame schema: a write plans twice
    (before the lock and under it) and every partition of a range run plans the same shapes."""
    key = (
        spec.name,
        spec.primary_key,
        table_schema.schema_id,
        tuple((f.field_id, f.name, str(f.field_type), f.required) for f in table_schema.fields),
        tuple(frame.schema.items()),
    )
    planned = _PLANNED.get(key)
    if planned is None:
        planned = _plan_evolution(spec, table_schema, frame)
        if len(_PLANNED) >= _PLANNED_MAX:
            _PLANNED.clear()
        _PLANNED[key] = planned
    return Evolution(add=list(planned.add), widen=list(planned.widen))


def _plan_evolution(spec: DatasetSpec, table_schema: Schema, frame: pl.DataFrame) -> Evolution:
    arrow = arrow_schema_of(frame)
    evolution = Evolution()
    table_names = {f.name for f in table_schema.fields}
    types = iceberg_types_of(arrow, (n for n, t in frame.schema.items() if t != pl.Null))
    for name in frame.columns:
        if frame.schema[name] == pl.Null:
            # an all-null column of no type: takes the table's type, or string when new
            if name not in table_names:
                evolution.add.append((name, StringType()))
            continue
        new_type = types[name]
        if name not in table_names:
            if name in spec.primary_key:
                raise SchemaMismatch(
                    f"dataset {spec.name!r}: primary-key column {name!r} is not in the existing "
                    "table; changing the key of an existing table is not supported"
                )
            evolution.add.append((name, new_type))
            continue
        old_type = table_schema.find_field(name).field_type
        if _widens_to(new_type, old_type):
            continue
        if (
            name not in spec.primary_key
            and isinstance(old_type, PrimitiveType)
            and _widens_to(old_type, new_type)
            and isinstance(new_type, PrimitiveType)
        ):
            evolution.widen.append((name, new_type))
            continue
        raise SchemaMismatch(
            f"dataset {spec.name!r}: column {name!r} has type {new_type} in the compute but "
            f"{old_type} in the table; that change is not compatible (nothing was written): "
            f"cast it to {old_type} in the compute, or {TYPE_CHANGE_DOC}"
        )
    return evolution


def check_required(spec: DatasetSpec, frame: pl.DataFrame, schema: Schema) -> None:
    """Refuse nulls for a required (NOT NULL) column, before any data file is written.

    The project makes only key columns required (and refuses null keys), but a table created
    outside it (plain pyiceberg, Spark) may have other required columns: a compute that leaves one
    null, or lacks it, would fail in pyarrow's cast (`Casting field ... to non-nullable`).
    """
    if not frame.height:
        return
    for f in schema.fields:
        if not f.required:
            continue
        if f.name not in frame.columns:
            raise BadInput(
                f"dataset {spec.name!r}: column {f.name!r} is required (NOT NULL) in the "
                "Iceberg table but missing from the compute's output; return it (nothing was "
                "written)"
            )
        nulls = frame.get_column(f.name).null_count()
        if nulls:
            raise BadInput(
                f"dataset {spec.name!r}: column {f.name!r} is required (NOT NULL) in the "
                f"Iceberg table but {nulls} row(s) of the compute have null there; fill or drop "
                "them in the compute (nothing was written)"
            )


def conform(frame: pl.DataFrame, schema: Schema) -> pa.Table:
    """`frame` as an Arrow table with exactly `schema`'s columns, order, types and nullability.

    Columns the table has but the compute lacks are filled with nulls.
    """
    target = schema.as_arrow()
    columns = []
    for f in target:
        if f.name in frame.columns:
            columns.append(frame.get_column(f.name).to_arrow())
        else:
            columns.append(pa.nulls(frame.height, type=f.type))
    table = pa.Table.from_arrays(columns, names=[f.name for f in target])
    return table.cast(target)
