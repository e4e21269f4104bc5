"""Changing a column's type, on both arms (issue 42, item 11): an incompatible change is refused with
nothing written and the refusal names the documented way forward (docs/concepts.md, "Changing a
column type"); each way that section documents works as it says — the promotions Iceberg
allows widen the table, a cast in the compute keeps the table's type, a new column beside the old
one, a rebuild under a new dataset name, and (Iceberg arm) the old table renamed aside."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec
from pipeline_output.errors import SchemaMismatch
from pipeline_output_tests.iceberg_harness import Harness
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.stores.arms import IcebergArm

DOCS = Path(__file__).resolve().parents[3] / "docs" / "concepts.md"
WAY_FORWARD = "see docs/concepts.md#changing-a-column-type"


def anchors(markdown: str) -> set[str]:
    """The heading anchors GitHub renders for a Markdown file."""
    out = set()
    for line in markdown.splitlines():
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def orders(ids: list[int], *, amount: pl.Expr | None = None) -> pl.DataFrame:
    frame = pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "qty": pl.Series([i % 7 for i in ids], dtype=pl.Int32),
            "price": pl.Series([i / 4 for i in ids], dtype=pl.Float32),
            "cost": pl.Series([Decimal(i) / 100 for i in ids], dtype=pl.Decimal(9, 2)),
            "amount": pl.Series([float(i) for i in ids], dtype=pl.Float64),
        }
    )
    return frame if amount is None else frame.with_columns(amount.alias("amount"))


SPEC = DatasetSpec(name="orders", primary_key=("id",))


def test_the_refusal_names_the_documented_way_forward_and_the_section_exists(h):
    h.write(SPEC, orders([1, 2, 3]))
    before = h.footprint(SPEC)
    with pytest.raises(SchemaMismatch) as err:
        h.write(SPEC, orders([4], amount=pl.lit("x")), run_id="r2")
    message = str(err.value)
    assert "'amount'" in message and "nothing was written" in message
    assert message.endswith(WAY_FORWARD) and "\n" not in message, message
    assert h.footprint(SPEC) == before
    assert WAY_FORWARD.rsplit("#", 1)[1] in anchors(DOCS.read_text(encoding="utf-8"))


def test_the_promotions_iceberg_allows_widen_the_table(h):
    h.write(SPEC, orders([1, 2]))
    wider = orders([3]).with_columns(
        pl.col("qty").cast(pl.Int64),  # int -> long
        pl.col("price").cast(pl.Float64),  # float -> double
        pl.col("cost").cast(pl.Decimal(18, 2)),  # decimal(9, 2) -> decimal(18, 2)
    )
    h.write(SPEC, wider, run_id="r2")
    schema = h.rows(SPEC).schema
    assert (schema["qty"], schema["price"], schema["cost"]) == (
        pl.Int64,
        pl.Float64,
        pl.Decimal(18, 2),
    )
    assert sorted(h.rows(SPEC)["id"].to_list()) == [1, 2, 3]


def test_the_documented_ways_forward_work(h):
    h.write(SPEC, orders([1, 2]))
    # cast in the compute to the table's type
    h.write(SPEC, orders([3], amount=pl.lit("7.5").cast(pl.Float64)), run_id="r2")
    assert h.rows(SPEC).schema["amount"] == pl.Float64
    # a new column with the new type; the old one stays, null in the rows written from now on
    text = orders([4]).with_columns(amount_text=pl.lit("4.00")).drop("amount")
    h.write(SPEC, text, run_id="r3")
    rows = h.rows(SPEC).sort("id")
    assert rows["amount_text"].to_list() == [None, None, None, "4.00"]
    assert rows["amount"].to_list() == [1.0, 2.0, 7.5, None]
    # a full rebuild under a new dataset name: a new table, its first deploy takes the new type
    v2 = DatasetSpec(name="orders_v2", primary_key=("id",))
    rebuilt = orders([1, 2], amount=pl.lit("x"))
    res = h.write(v2, rebuilt, run_id="r4")
    assert res.first_deploy and res.write_mode == "replace"
    assert_same_multiset(h.rows(v2), rebuilt)


def test_an_iceberg_table_renamed_aside_is_rebuilt_under_the_same_name(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str
) -> None:
    """Iceberg arm only: the legacy arm keeps the registered schema (rebuild under a new name)."""
    h = IcebergArm(Harness(catalog, fresh_catalog, pg_db_url))
    h.write(SPEC, orders([1, 2]))
    catalog = h.iceberg.fresh()
    catalog.rename_table(("datasets", "orders"), ("datasets", "orders_old"))
    rebuilt = orders([1, 2, 3], amount=pl.lit("x"))
    res = h.write(SPEC, rebuilt, run_id="r2")
    assert res.first_deploy and res.write_mode == "replace"
    assert_same_multiset(h.rows(SPEC), rebuilt)
    assert h.iceberg.raw("orders_old").schema["amount"] == pl.Float64  # the old table, kept
