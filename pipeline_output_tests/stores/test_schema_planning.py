"""Planning a write's schema changes (`stores.schema.plan_evolution`): each compute column's
Iceberg type, compared with the table's."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType

from pipeline_output import DatasetSpec
from pipeline_output.errors import SchemaMismatch
from pipeline_output.stores.schema import plan_evolution

TABLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "qty", IntegerType(), required=False),
    NestedField(3, "label", StringType(), required=False),
    identifier_field_ids=[1],
)


def test_a_frames_columns_are_typed_by_one_conversion_each_column_its_own_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyiceberg reads its configuration (file and environment) for every conversion: a frame's
    columns are converted together, once, and each keeps its own type (the converted fields have
    no ids yet, so they are matched by position, not looked up by name)."""
    converted: list[Any] = []
    real = Catalog._convert_schema_if_needed

    def counted(schema: Any, *args: Any, **kwargs: Any) -> Any:
        converted.append(schema)
        return real(schema, *args, **kwargs)

    monkeypatch.setattr(Catalog, "_convert_schema_if_needed", staticmethod(counted))
    frame = pl.DataFrame(
        {
            "id": pl.Series([1], dtype=pl.Int64),
            "qty": pl.Series([2], dtype=pl.Int32),
            "label": ["a"],
            "amount": [1.5],
            "empty": pl.Series([None], dtype=pl.Null),
        }
    )
    spec = DatasetSpec(name="typed_once", primary_key=("id",))
    planned = plan_evolution(spec, TABLE, frame)
    assert planned.add == [("amount", DoubleType()), ("empty", StringType())]
    assert planned.widen == []
    assert len(converted) == 1

    with pytest.raises(SchemaMismatch, match="'qty' has type string"):
        plan_evolution(spec, TABLE, frame.with_columns(pl.col("qty").cast(pl.String)))
