"""The native arm's partitioning: a dataset's `partition_by` terms as an Iceberg partition spec,
each row's partition values (pyiceberg's own vectorised transforms, from the `pyiceberg-core`
extra, so bucket and truncate match every other Iceberg engine), spec evolution when the terms
change, and the partition values a batch of keys can be in (pruning).

Evolution follows Iceberg: the table's spec is updated in the write's own transaction, files
written from then on are partitioned by the new spec, files written before keep theirs. A dataset
that says nothing about partitioning (`partition_by=None`) keeps the table's spec, whoever made
it; `partition_by=()` says unpartitioned.

pyiceberg expressions of the native arm: a window as a row filter, aligned to the
watermark field's type, and file-level relations from column bounds — of a delta window
(`window_relation`) and of a Dagster partition's slice (`slice_relation`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from typing import Any

import polars as pl
import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import And, BooleanExpression, GreaterThan, LessThanOrEqual
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    DateType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros

from pipeline_output.contract.partitioning import PartitionTerm
from pipeline_output.contract.slices import Equals, OneOf, PartitionSlice, Term
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.errors import InvalidSpec

_FIRST_FIELD_ID = 1000  # Iceberg's partition field ids start here
_PRUNABLE = (IdentityTransform, BucketTransform, TruncateTransform)


def transform_of(term: PartitionTerm) -> Transform:  # type: ignore[type-arg]
    """The pyiceberg transform of a term."""
    if term.transform == "bucket":
        assert term.size is not None
        return BucketTransform(term.size)
    if term.transform == "truncate":
        assert term.size is not None
        return TruncateTransform(term.size)
    unary: dict[str, Transform] = {  # type: ignore[type-arg]
        "identity": IdentityTransform(),
        "year": YearTransform(),
        "month": MonthTransform(),
        "day": DayTransform(),
        "hour": HourTransform(),
    }
    return unary[term.transform]


def _fields(spec: DatasetSpec, schema: Schema) -> list[tuple[int, Transform, str]]:  # type: ignore[type-arg]
    """(source field id, transform, name) per term, refused where Iceberg cannot apply it."""
    out = []
    for term in spec.partition_terms:
        field = next((f for f in schema.fields if f.name == term.column), None)
        if field is None:
            raise InvalidSpec(
                f"dataset {spec.name!r}: partition_by {str(term)!r} names column "
                f"{term.column!r}, which the computed data does not have"
            )
        transform = transform_of(term)
        if not transform.can_transform(field.field_type):
            raise InvalidSpec(
                f"dataset {spec.name!r}: partition_by {str(term)!r} cannot apply "
                f"{term.transform} to column {term.column!r} of type {field.field_type}"
            )
        out.append((field.field_id, transform, term.field_name))
    return out


def partition_spec(spec: DatasetSpec, schema: Schema) -> PartitionSpec:
    """The create-time partition spec of `spec` over `schema` (unpartitioned without terms)."""
    fields = _fields(spec, schema)
    if not fields:
        return UNPARTITIONED_PARTITION_SPEC
    return PartitionSpec(
        *(
            PartitionField(source_id=sid, field_id=_FIRST_FIELD_ID + i, transform=t, name=name)
            for i, (sid, t, name) in enumerate(fields)
        )
    )


def _live(pspec: PartitionSpec) -> list[PartitionField]:
    """The fields of `pspec` that partition (a v1 table keeps removed fields as `void`)."""
    return [f for f in pspec.fields if not isinstance(f.transform, VoidTransform)]


def _current(metadata: TableMetadata) -> list[tuple[int, str]]:
    return [(f.source_id, str(f.transform)) for f in _live(metadata.spec())]


def needs_evolution(spec: DatasetSpec, metadata: TableMetadata) -> bool:
    """Whether the table's current spec differs from what `spec` declares (a spec that says
    nothing about partitioning, `partition_by=None`, keeps the table's spec as it is)."""
    if spec.partition_by is None:
        return False
    wanted = [(sid, str(t)) for sid, t, _ in _fields(spec, metadata.schema())]
    return wanted != _current(metadata)


def evolve(tx: Transaction, spec: DatasetSpec) -> bool:
    """Make the table's current partition spec the declared one, in `tx`; True when it changed.

    As Iceberg evolves a spec, in one update: the fields the declaration keeps in place stay
    (same field id and name), the others are removed (a v1 table keeps them as `void`), and the
    declared fields from the first difference on are added. An added field whose usual name
    (`id_bucket`) named another field of the table, in any spec, gets a fresh one (`id_bucket_8`):
    a partition field name always means one transform of one column."""
    metadata = tx.table_metadata
    if not needs_evolution(spec, metadata):
        return False
    schema = metadata.schema()
    wanted = _fields(spec, schema)
    current = _live(metadata.spec())
    keep = 0
    while (
        keep < min(len(current), len(wanted))
        and current[keep].source_id == wanted[keep][0]
        and str(current[keep].transform) == str(wanted[keep][1])
    ):
        keep += 1
    removed = current[keep:]
    gone = {f.field_id for f in removed} if metadata.format_version >= 2 else set()
    taken = {f.name for f in metadata.spec().fields if f.field_id not in gone}
    with tx.update_spec() as update:
        for old in removed:
            update.remove_field(old.name)
        for sid, transform, usual in wanted[keep:]:
            name = _field_name(metadata, sid, transform, usual, taken=taken)
            taken.add(name)
            update.add_field(schema.find_field(sid).name, transform, name)
    return True


def _field_name(
    metadata: TableMetadata,
    source_id: int,
    transform: Transform,  # type: ignore[type-arg]
    usual: str,
    *,
    taken: set[str],
) -> str:
    """The name of an added partition field: the one the table's history gave this transform of
    this column (Iceberg then reuses its field id), else the usual one, else a fresh one; never a
    name of another field of the new spec, of another transform in an earlier spec, or of a
    column (only an identity field may carry its own column's name)."""
    meaning: dict[str, tuple[int, str]] = {}
    for pspec in metadata.specs().values():
        for f in pspec.fields:
            if not isinstance(f.transform, VoidTransform):
                meaning.setdefault(f.name, (f.source_id, str(f.transform)))
    this = (source_id, str(transform))
    schema = metadata.schema()

    def free(name: str) -> bool:
        if name in taken or meaning.get(name, this) != this:
            return False
        column = next((f for f in schema.fields if f.name == name), None)
        return column is None or (
            isinstance(transform, IdentityTransform) and column.field_id == source_id
        )

    for spec_id in sorted(metadata.specs(), reverse=True):
        for f in metadata.specs()[spec_id].fields:
            if (f.source_id, str(f.transform)) == this and free(f.name):
                return f.name
    size = getattr(transform, "num_buckets", None) or getattr(transform, "width", None)
    first = [usual, f"{usual}_{size}"] if size is not None else [usual]
    for name in first:
        if free(name):
            return name
    n = 2
    while not free(f"{first[-1]}_{n}"):
        n += 1
    return f"{first[-1]}_{n}"


def partition_columns(frame: pl.DataFrame, metadata: TableMetadata) -> list[pl.Series]:
    """Each row's value of every field of the table's current spec (named `__po_part_<i>`)."""
    schema = metadata.schema()
    out = []
    for i, field in enumerate(metadata.spec().fields):
        source = schema.find_field(field.source_id)
        values = frame.get_column(source.name).to_arrow()
        transformed = field.transform.pyarrow_transform(source.field_type)(values)
        out.append(_series(f"__po_part_{i}", transformed))
    return out


def _series(name: str, values: pa.Array | pa.ChunkedArray) -> pl.Series:
    series = pl.from_arrow(values)
    assert isinstance(series, pl.Series)
    return series.alias(name)


def key_partition_values(
    spec: DatasetSpec, metadata: TableMetadata, frame: pl.DataFrame
) -> dict[int, set[object]] | None:
    """For the fields of the current spec whose source is a primary-key column: the partition
    values the batch's keys fall in (field position -> values). A target row with one of the
    batch's keys lies in a file whose partition holds these values. None: no such field."""
    schema = metadata.schema()
    pk = set(spec.primary_key)
    values: dict[int, set[object]] = {}
    for i, field in enumerate(metadata.spec().fields):
        source = schema.find_field(field.source_id)
        if source.name not in pk or source.name not in frame.columns:
            continue
        # only where the partition record holds the transform's value as polars reads it back
        if not isinstance(field.transform, _PRUNABLE) or not isinstance(
            source.field_type, (IntegerType, LongType, StringType)
        ):
            continue
        column = frame.get_column(source.name).to_arrow()
        transformed = field.transform.pyarrow_transform(source.field_type)(column)
        values[i] = set(_series("v", transformed).unique().to_list())
    return values or None


def physical(series: pl.Series, iceberg_type: PrimitiveType) -> pl.Series:
    """Key values in the representation Iceberg bounds decode to (micros, days, ...)."""
    if isinstance(iceberg_type, (TimestampType, TimestamptzType)):
        return series.dt.epoch("us")
    if isinstance(iceberg_type, DateType):
        return series.cast(pl.Int32)
    return series


def _bound_value(value: Any, iceberg_type: PrimitiveType) -> Any:
    """`value` as Iceberg's bounds of `iceberg_type` decode: micros since the epoch (a naive
    datetime read as UTC, as polars' dt.epoch reads it), days since the epoch."""
    if isinstance(iceberg_type, (TimestampType, TimestamptzType)) and isinstance(value, datetime):
        return datetime_to_micros(value)
    if isinstance(iceberg_type, DateType) and isinstance(value, date):
        if isinstance(value, datetime):  # what polars makes of a datetime cast to Int32
            return pl.Series([value]).cast(pl.Int32)[0]
        return date_to_days(value)
    return value


def window_relation(task: FileScanTask, schema: Schema, wm: str, window: Window) -> str:
    """`inside`, `outside` or `straddles`: where a file's watermark range lies against a window."""
    field = schema.find_field(wm)
    ftype = field.field_type
    lo_b = task.file.lower_bounds.get(field.field_id) if task.file.lower_bounds else None
    hi_b = task.file.upper_bounds.get(field.field_id) if task.file.upper_bounds else None
    nulls = (task.file.null_value_counts or {}).get(field.field_id, 0)
    if lo_b is None or hi_b is None or not isinstance(ftype, PrimitiveType):
        return "straddles"
    lo, hi = from_bytes(ftype, lo_b), from_bytes(ftype, hi_b)
    w_high = _bound_value(window.high, ftype)
    w_low = _bound_value(window.low, ftype) if window.low is not None else None
    if lo > w_high or (w_low is not None and hi <= w_low):
        return "outside"
    if hi <= w_high and (w_low is None or lo > w_low) and not nulls:
        return "inside"
    return "straddles"


# the polars type whose values a slice term compares with, per Iceberg field type
_SLICE_TYPES: dict[type[PrimitiveType], Any] = {
    DateType: pl.Date(),
    TimestampType: pl.Datetime("us"),
    TimestamptzType: pl.Datetime("us", "UTC"),
    StringType: pl.String(),
    IntegerType: pl.Int32(),
    LongType: pl.Int64(),
}


def slice_relation(task: FileScanTask, schema: Schema, partition: PartitionSlice) -> str:
    """`inside`, `outside` or `straddles`: where a file's rows lie against a partition's slice,
    from its column bounds (a file of a table partitioned like the Dagster partitions lies
    wholly inside or outside). A column the schema lacks holds no row of the slice."""
    return slice_test(schema, partition)(task)


def slice_test(schema: Schema, partition: PartitionSlice) -> Callable[[FileScanTask], str]:
    """`slice_relation` of `partition` for any file of `schema`'s table: the slice's fields and
    bounds resolved once, each file's bounds compared (a commit tests every live file)."""
    tests = [_term_test(schema, term) for term in partition.terms]

    def relation(task: FileScanTask) -> str:
        relations = [test(task) for test in tests]
        if "outside" in relations:
            return "outside"
        return "inside" if all(r == "inside" for r in relations) else "straddles"

    return relation


def _term_test(schema: Schema, term: Term) -> Callable[[FileScanTask], str]:
    try:
        field = schema.find_field(term.column)
    except ValueError:
        return lambda task: "outside"
    ftype = field.field_type
    dtype = _SLICE_TYPES.get(type(ftype)) if isinstance(ftype, PrimitiveType) else None
    if dtype is None or not isinstance(ftype, PrimitiveType):
        return lambda task: "straddles"
    field_id = field.field_id
    if isinstance(term, OneOf):
        values = [_bound_value(v, ftype) for v in term.values if v is not None]
    elif isinstance(term, Equals):
        value = _bound_value(term.typed(dtype), ftype)
    else:
        low, high = (_bound_value(b, ftype) for b in term.bounds(dtype))

    def test(task: FileScanTask) -> str:
        file = task.file
        lo_b = file.lower_bounds.get(field_id) if file.lower_bounds else None
        hi_b = file.upper_bounds.get(field_id) if file.upper_bounds else None
        if lo_b is None or hi_b is None:
            return "straddles"
        nulls = (file.null_value_counts or {}).get(field_id, 0)
        lo, hi = from_bytes(ftype, lo_b), from_bytes(ftype, hi_b)
        if isinstance(term, OneOf):
            return "straddles" if any(lo <= v <= hi for v in values) else "outside"
        if isinstance(term, Equals):
            if value < lo or value > hi:
                return "outside"
            return "inside" if lo == hi == value and not nulls else "straddles"
        if hi < low or lo >= high:
            return "outside"
        return "inside" if lo >= low and hi < high and not nulls else "straddles"

    return test


def window_filter(
    watermark: str, window: Window, *, schema: Schema | None = None
) -> BooleanExpression:
    """An Iceberg row filter for `low < watermark <= high`.

    With the table's `schema`, datetime bounds are zoned like the watermark field (`timestamptz`
    literals carry `+00:00`, `timestamp` literals none): pyiceberg refuses the other way round.
    """
    if schema is not None:
        window = aligned_to_field(window, schema, watermark)
    high: BooleanExpression = LessThanOrEqual(watermark, _literal(window.high))  # type: ignore[call-arg,arg-type]
    if window.low is None:
        return high
    low: BooleanExpression = GreaterThan(watermark, _literal(window.low))  # type: ignore[call-arg,arg-type]
    return And(low, high)


def aligned_to_field(window: Window, schema: Schema, watermark: str) -> Window:
    """The window with bounds zoned like the table's watermark field (unchanged otherwise)."""
    try:
        field = schema.find_field(watermark)
    except ValueError:
        return window
    if isinstance(field.field_type, TimestamptzType):
        return window.aligned(aware=True)
    if isinstance(field.field_type, TimestampType):
        return window.aligned(aware=False)
    return window


def _literal(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value
