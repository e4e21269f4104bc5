"""Scan planning with fastavro-decoded manifests (`scan_planning.planned`) plans exactly the files,
delete files and residuals pyiceberg's own `DataScan.plan_files` plans, on tables partitioned by
identity on every primitive type pyiceberg writes (those decoded here and those left to pyiceberg's decoder) and
across a partition spec's evolution. The project's own tables (deletes, evolution, compaction)
are compared in test_engine_interop.py."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    IsNull,
    LessThanOrEqual,
)
from pyiceberg.manifest import ManifestFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from pipeline_output.stores.iceberg.table.manifest_decoding import (
    live_paths,
    manifest_entries,
    manifest_files,
)
from pipeline_output.stores.iceberg.table.scan_planning import planned

COLUMNS: list[tuple[str, Any, pa.DataType, list[Any]]] = [
    ("i", IntegerType(), pa.int32(), [1, 2, None]),
    ("l", LongType(), pa.int64(), [10, -(2**40), 30]),
    ("s", StringType(), pa.large_string(), ["a", "é", None]),
    ("b", BooleanType(), pa.bool_(), [True, False, None]),
    ("d", DateType(), pa.date32(), [date(2024, 1, 3), date(1969, 12, 31), None]),
    (
        "ts",
        TimestampType(),
        pa.timestamp("us"),
        [datetime(2024, 1, 3, 4, 5, 6, 7), datetime(1960, 1, 1), None],
    ),
    (
        "tz",
        TimestamptzType(),
        pa.timestamp("us", tz="UTC"),
        [datetime(2024, 1, 3, 4, 5, 6, 7, tzinfo=UTC), None, datetime(1970, 1, 1, tzinfo=UTC)],
    ),
    ("f", DoubleType(), pa.float64(), [1.5, -0.0, None]),
    ("bin", BinaryType(), pa.large_binary(), [b"\x00\x01", b"", None]),
    ("dec", DecimalType(9, 2), pa.decimal128(9, 2), [Decimal("1.25"), None, Decimal("-3.00")]),
    ("t", TimeType(), pa.time64("us"), [time(1, 2, 3), None, time(23, 59, 59, 999999)]),
]


DECODED = 9  # the first 9: partition values fastavro decodes here; decimal, time: pyiceberg


def _arrow(rows: slice) -> pa.Table:
    fields, arrays = [], []
    for i, (name, _, kind, values) in enumerate(COLUMNS, start=1):
        fields.append(pa.field(name, kind, nullable=True, metadata={"PARQUET:field_id": str(i)}))
        arrays.append(pa.array(values[rows], type=kind))
    return pa.Table.from_arrays(
        [*arrays, pa.array(range(3))[rows]], names=[*[f.name for f in fields], "n"]
    )


def _norm(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


def _plan(scan: Any) -> list[tuple[Any, ...]]:
    return [
        (
            t.file.file_path,
            [_norm(v) for v in t.file._data],
            t.file.spec_id,
            sorted(d.file_path for d in t.delete_files),
            repr(t.residual),
        )
        for t in scan.plan_files()
    ]


FILTERS: list[BooleanExpression] = [
    AlwaysTrue(),
    EqualTo("l", 10),
    GreaterThan("d", "2000-01-01"),
    And(LessThanOrEqual("ts", "2024-01-03T04:05:06.000007"), EqualTo("s", "a")),
    IsNull("i"),
]


def _table(catalog: Any, name: str, partitioned: int) -> Any:
    schema = Schema(
        *[
            NestedField(i, name, kind, required=False)
            for i, (name, kind, _, _) in enumerate(COLUMNS, start=1)
        ],
        NestedField(len(COLUMNS) + 1, "n", LongType(), required=False),
    )
    spec = PartitionSpec(
        *[
            PartitionField(i, 1000 + i, IdentityTransform(), f"{name}_p")
            for i, (name, *_) in enumerate(COLUMNS[:partitioned], start=1)
        ]
    )
    created = catalog.create_table(f"datasets.{name}", schema=schema, partition_spec=spec)
    for row in range(3):
        created.append(_arrow(slice(row, row + 1)))
    return catalog.load_table(f"datasets.{name}")


@pytest.fixture
def decoded(catalog: Any) -> Any:
    """Partitioned by identity on each type decoded here."""
    return _table(catalog, "decoded", DECODED)


@pytest.fixture
def every(catalog: Any) -> Any:
    """Partitioned by identity on every type (decimal and time too: pyiceberg decodes)."""
    return _table(catalog, "every", len(COLUMNS))


def test_planning_decodes_identity_partitions_of_every_type_as_pyiceberg_does(decoded, every):
    for table in (decoded, every):
        for row_filter in FILTERS:
            ours = planned(table).scan(row_filter=row_filter)
            assert _plan(ours) == _plan(table.scan(row_filter=row_filter)), row_filter
        assert len(_plan(planned(table).scan())) == 3


def test_manifest_entries_are_pyiceberg_entries_value_for_value(decoded, every):
    for table in (decoded, every):
        for manifest in table.current_snapshot().manifests(table.io):
            ours = manifest_entries(table.io, manifest)
            theirs = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            assert [e._data[:4] for e in ours] == [e._data[:4] for e in theirs]
            assert [[_norm(v) for v in e.data_file._data] for e in ours] == [
                [_norm(v) for v in e.data_file._data] for e in theirs
            ]
            assert [e.data_file.spec_id for e in ours] == [e.data_file.spec_id for e in theirs]


def test_manifest_lists_are_pyiceberg_manifest_files_value_for_value(decoded, every, catalog):
    evolving = _evolving(catalog)
    for table in (decoded, every, evolving):
        for snapshot in table.snapshots():
            ours = manifest_files(table.io, snapshot)
            theirs = list(snapshot.manifests(table.io))
            assert [_norm_record(m) for m in ours] == [_norm_record(m) for m in theirs]


def test_live_paths_are_the_paths_of_pyiceberg_live_entries(decoded, catalog):
    """Reachability's path-only decoding (expiry, orphans), on manifests with removed entries."""
    table = _evolving(catalog)
    table.delete(EqualTo("id", 1))  # rewrites files: manifests with DELETED entries
    table = catalog.load_table("datasets.evolving")
    seen_deleted = False
    for t in (decoded, table):
        for snapshot in t.snapshots():
            for manifest in snapshot.manifests(t.io):
                entries = manifest.fetch_manifest_entry(t.io, discard_deleted=False)
                seen_deleted |= any(e.status.value == 2 for e in entries)
                live = [e.data_file.file_path for e in entries if e.status.value != 2]
                assert live_paths(t.io, manifest) == live
    assert seen_deleted


def _norm_record(manifest: Any) -> list[Any]:
    return [
        [list(p._data) for p in value] if isinstance(value, list) else value
        for value in manifest._data
    ]


def test_the_decoded_types_never_fall_back_to_pyiceberg(decoded, monkeypatch):
    expected = _plan(decoded.scan())

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decoded by pyiceberg")

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", refused)
    monkeypatch.setattr(Snapshot, "manifests", refused)
    assert _plan(planned(decoded).scan()) == expected


def _evolving(catalog: Any) -> Any:
    """Two appends, the second after a day partition field was added to an unpartitioned spec."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "day", DateType(), required=False),
    )
    table = catalog.create_table("datasets.evolving", schema=schema)
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "day": pa.array([date(2024, 1, 1), None])})
    table.append(rows)
    with table.update_spec() as update:
        update.add_field("day", DayTransform(), "day_d")
    table.append(rows)
    return catalog.load_table("datasets.evolving")


def test_planning_follows_a_partition_spec_evolution_and_time_travel(catalog: Any):
    table = _evolving(catalog)
    first = table.snapshots()[0].snapshot_id
    for snapshot in (first, None):
        for row_filter in (AlwaysTrue(), EqualTo("day", "2024-01-01"), EqualTo("id", 3)):
            ours = planned(table).scan(row_filter=row_filter, snapshot_id=snapshot)
            assert _plan(ours) == _plan(table.scan(row_filter=row_filter, snapshot_id=snapshot))


def test_target_schema_maps_every_iceberg_type_as_its_arrow_schema_reads_back() -> None:
    """The reads' polars schema: primitive columns mapped directly, any other schema through
    Arrow — the same types either way (nested, uuid and fixed columns among them)."""
    import pyiceberg.types as t

    from pipeline_output.contract.checked_input import polars_schema
    from pipeline_output.stores.iceberg.table.native_scan import target_schema

    primitives: list[t.IcebergType] = [
        *(t.BooleanType(), t.IntegerType(), t.LongType(), t.FloatType(), t.DoubleType()),
        *(t.DateType(), t.TimeType(), t.TimestampType(), t.TimestamptzType()),
        *(t.TimestampNanoType(), t.TimestamptzNanoType(), t.StringType(), t.BinaryType()),
        *(t.DecimalType(10, 2), t.DecimalType(38, 0)),
    ]
    others: list[t.IcebergType] = [
        *(t.UUIDType(), t.FixedType(3)),
        t.ListType(100, t.LongType(), element_required=False),
        t.StructType(t.NestedField(101, "x", t.StringType(), required=False)),
    ]
    for types in (primitives, [*primitives, *others]):
        schema = Schema(
            *[t.NestedField(i + 1, f"c{i}", f, required=i % 2 == 0) for i, f in enumerate(types)]
        )
        assert target_schema(schema) == polars_schema(schema.as_arrow())
