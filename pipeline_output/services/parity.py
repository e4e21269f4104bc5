"""Parity: do the legacy (Postgres) and native (Iceberg) arms hold the same dataset?

Same rows as a multiset of typed rows — order-independent, compared through per-row hashes of the
typed values (nulls equal nulls, NaN equals NaN, -0.0 equals 0.0, columns compared by name) — and
the same count. On a mismatch the report lists up to `max_keys` differing keys per side (the
primary key, or the whole row for keyless datasets). Pure core: no Dagster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipeline_output.contract.spec import DatasetSpec

MAX_KEYS = 20
_HASH = "__po_row_hash__"


@dataclass(frozen=True)
class ParityReport:
    """The outcome of one comparison."""

    dataset: str
    passed: bool
    pg_count: int
    iceberg_count: int
    only_in_pg: list[Any] = field(default_factory=list)
    only_in_iceberg: list[Any] = field(default_factory=list)
    detail: str = ""
    unwritten: str | None = None  # an arm that never held a write of the dataset

    def summary(self) -> str:
        """One line for logs and the CLI."""
        state = "PASS" if self.passed else "FAIL"
        text = f"{self.dataset}: parity {state} (pg {self.pg_count} rows, iceberg {self.iceberg_count} rows)"
        if not self.passed and self.unwritten:
            text += f"; {self.detail}"
        elif not self.passed:
            text += (
                f"; {len(self.only_in_pg)} differing key(s) only in pg, "
                f"{len(self.only_in_iceberg)} only in iceberg"
            )
            if self.detail:
                text += f"; {self.detail}"
        return text


def _normalise(frame: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    exprs = []
    for name in columns:
        if name not in frame.columns:
            exprs.append(pl.lit(None).alias(name))
            continue
        col = pl.col(name)
        dtype = frame.schema[name]
        if dtype.is_float():
            # -0.0 == 0.0 for comparison purposes (jsonb has no negative zero)
            col = pl.when(col == 0.0).then(pl.lit(0.0, dtype=dtype)).otherwise(col).alias(name)
        exprs.append(col)
    return frame.select(exprs)


def _hashed(frame: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    norm = _normalise(frame, columns)
    return frame.with_columns(norm.select(pl.struct(columns).hash(seed=7).alias(_HASH)).to_series())


def compare(
    spec: DatasetSpec,
    pg: pl.DataFrame,
    iceberg: pl.DataFrame,
    *,
    max_keys: int = MAX_KEYS,
) -> ParityReport:
    """Compare the two arms' contents as typed multisets (an arm never written: no columns)."""
    if not pg.columns:
        pg = pl.DataFrame(schema=iceberg.schema)
    if not iceberg.columns:
        iceberg = pl.DataFrame(schema=pg.schema)
    columns = sorted(set(pg.columns) | set(iceberg.columns))
    detail = ""
    mismatched_types = [
        c
        for c in columns
        if c in pg.columns and c in iceberg.columns and pg.schema[c] != iceberg.schema[c]
    ]
    if mismatched_types:
        detail = "type differences: " + ", ".join(
            f"{c} (pg {pg.schema[c]}, iceberg {iceberg.schema[c]})" for c in mismatched_types
        )
        pg = pg.with_columns(
            [pl.col(c).cast(iceberg.schema[c], strict=False) for c in mismatched_types]
        )
    left = _hashed(pg, columns)
    right = _hashed(iceberg, columns)
    lc = left.group_by(_HASH).len("n_pg")
    rc = right.group_by(_HASH).len("n_ice")
    joined = lc.join(rc, on=_HASH, how="full", coalesce=True).fill_null(0)
    diff = joined.filter(pl.col("n_pg") != pl.col("n_ice"))
    passed = diff.height == 0 and pg.height == iceberg.height and not mismatched_types
    only_pg: list[Any] = []
    only_ice: list[Any] = []
    if diff.height:
        more_pg = diff.filter(pl.col("n_pg") > pl.col("n_ice")).select(_HASH)
        more_ice = diff.filter(pl.col("n_ice") > pl.col("n_pg")).select(_HASH)
        only_pg = _keys(spec, left.join(more_pg, on=_HASH, how="semi"), max_keys)
        only_ice = _keys(spec, right.join(more_ice, on=_HASH, how="semi"), max_keys)
    return ParityReport(
        dataset=spec.name,
        passed=passed,
        pg_count=pg.height,
        iceberg_count=iceberg.height,
        only_in_pg=only_pg,
        only_in_iceberg=only_ice,
        detail=detail,
    )


def _keys(spec: DatasetSpec, rows: pl.DataFrame, limit: int) -> list[Any]:
    pk = list(spec.primary_key)
    rows = rows.drop(_HASH).head(limit)
    if pk:
        sel = rows.select(pk)
        return [
            _json_safe(r[0]) if len(pk) == 1 else [_json_safe(v) for v in r] for r in sel.rows()
        ]
    return [{k: _json_safe(v) for k, v in r.items()} for r in rows.to_dicts()]


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
