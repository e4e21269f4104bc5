"""Pushed predicates: the part of a polars filter that both arms can evaluate before polars does.

Owns the translation of a polars expression (its serialized tree) into `Term`s — `Compare`,
`InList`, `Nullness`, `AnyOf` — which `lazy_reads` renders as a pyiceberg row filter or as SQL
conditions with parameters. Translated forms, on integer, string, boolean, date and datetime
columns: `col <op> literal` for `==`, `!=`, `<`, `<=`, `>`, `>=` (either side), `is_between`,
`is_in` with a literal list, `is_null`, `is_not_null`, a bare boolean column; `&` of any of them
(a conjunct that does not translate is left out, which only widens the filter) and `|` when both
sides translate. Everything else stays with polars: float and decimal columns (polars orders NaN
above every number, Iceberg and SQL comparisons do not), casts, arithmetic, string functions,
negation, comparisons between columns. The translation never narrows: its conjunction keeps every
row the predicate keeps, and readers re-apply the full predicate.

Reads the expression through `Expr.meta.serialize(format="json")`; a tree this module does not
recognise (another polars version's spelling, say) translates to nothing, so a read is only
slower, never wrong. Pure core: no Dagster.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import polars as pl


@dataclass(frozen=True)
class Compare:
    """`column <op> value` with `op` one of `==`, `!=`, `<`, `<=`, `>`, `>=`."""

    column: str
    op: str
    value: Any


@dataclass(frozen=True)
class InList:
    """`column IN values` (nulls never match)."""

    column: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Nullness:
    """`column IS NULL` (or `IS NOT NULL` when `negated`)."""

    column: str
    negated: bool


@dataclass(frozen=True)
class AnyOf:
    """A disjunction of conjunctions: `(a AND b) OR (c) OR ...`."""

    parts: tuple[tuple[Term, ...], ...]


Term = Compare | InList | Nullness | AnyOf

_OPS = {"Eq": "==", "NotEq": "!=", "Lt": "<", "LtEq": "<=", "Gt": ">", "GtEq": ">="}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_EPOCH = datetime(1970, 1, 1)
_TO_MICROS = {"Microseconds": 1, "Milliseconds": 1000}
_INTS = {"Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Int128"}


def pushable_terms(predicate: pl.Expr | None, schema: pl.Schema) -> list[Term]:
    """The conjuncts of `predicate` that translate (see the module docstring); [] for None.

    Their conjunction keeps every row `predicate` keeps (it may keep more): callers re-apply
    `predicate` to what they read.
    """
    if predicate is None:
        return []
    try:
        tree = json.loads(predicate.meta.serialize(format="json"))
    except Exception:  # an expression polars cannot serialize: nothing is pushed
        return []
    return _conjunction(tree, schema)


def _conjunction(node: Any, schema: pl.Schema) -> list[Term]:
    out: list[Term] = []
    for part in _split(node, "And"):
        out.extend(_terms(part, schema))
    return out


def _split(node: Any, op: str) -> list[Any]:
    binary = node.get("BinaryExpr") if isinstance(node, dict) else None
    if binary is not None and binary.get("op") in (op, f"Logical{op}"):
        return [*_split(binary["left"], op), *_split(binary["right"], op)]
    return [node]


def _terms(node: Any, schema: pl.Schema) -> list[Term]:
    """The translation of one conjunct: [] when it does not translate, else one or two terms."""
    if not isinstance(node, dict):
        return []
    if "Column" in node:  # a bare boolean column
        column = node["Column"]
        if isinstance(column, str) and isinstance(schema.get(column), pl.Boolean):
            return [Compare(column, "==", True)]
        return []
    binary = node.get("BinaryExpr")
    if binary is not None:
        if binary.get("op") in ("Or", "LogicalOr"):
            parts = [tuple(_conjunction(side, schema)) for side in _split(node, "Or")]
            return [AnyOf(tuple(parts))] if all(parts) else []
        op = _OPS.get(binary.get("op"))
        if op is None:
            return []
        left, right = binary["left"], binary["right"]
        if _column_of(right) is not None and _column_of(left) is None:
            left, right, op = right, left, _FLIPPED[op]
        column = _column_of(left)
        if column is None:
            return []
        ok, value = _literal(right, schema.get(column))
        return [Compare(column, op, value)] if ok and value is not None else []
    function = node.get("Function")
    if function is None:
        return []
    inputs = function.get("input") or []
    kind = function.get("function")
    boolean = kind.get("Boolean") if isinstance(kind, dict) else None
    column = _column_of(inputs[0]) if inputs else None
    if column is None or boolean is None:
        return []
    if boolean in ("IsNull", "IsNotNull") and len(inputs) == 1:
        return [Nullness(column, negated=boolean == "IsNotNull")]
    if isinstance(boolean, dict) and "IsBetween" in boolean and len(inputs) == 3:
        closed = (boolean["IsBetween"] or {}).get("closed", "Both")
        ok_low, low = _literal(inputs[1], schema.get(column))
        ok_high, high = _literal(inputs[2], schema.get(column))
        out: list[Term] = []
        if ok_low and low is not None:
            out.append(Compare(column, ">=" if closed in ("Both", "Left") else ">", low))
        if ok_high and high is not None:
            out.append(Compare(column, "<=" if closed in ("Both", "Right") else "<", high))
        return out
    if isinstance(boolean, dict) and "IsIn" in boolean and len(inputs) == 2:
        listed = _literal_list(inputs[1], schema.get(column))
        if listed is None:
            return []
        values, has_null = listed
        term: Term = InList(column, values)
        if has_null and (boolean["IsIn"] or {}).get("nulls_equal"):
            term = AnyOf(((term,), (Nullness(column, negated=False),)))  # null matches null
        return [term]
    return []


def _column_of(node: Any) -> str | None:
    if isinstance(node, dict) and isinstance(node.get("Column"), str):
        return str(node["Column"])
    return None


def _pushable_dtype(dtype: Any) -> bool:
    return isinstance(dtype, (pl.String, pl.Boolean, pl.Date, pl.Datetime)) or (
        dtype is not None and dtype.is_integer()
    )


def _literal(node: Any, dtype: Any) -> tuple[bool, Any]:
    """(True, python value) for a literal comparable with a column of `dtype` as polars does."""
    if not _pushable_dtype(dtype) or not isinstance(node, dict) or "Literal" not in node:
        return False, None
    lit = node["Literal"]
    if not isinstance(lit, dict) or len(lit) != 1:
        return False, None
    ((form, body),) = lit.items()
    if not isinstance(body, dict) or len(body) != 1:
        return False, None
    ((kind, value),) = body.items()
    if form == "Dyn" and kind == "Int":
        kind = "Int64"
    elif form != "Scalar":
        return False, None
    if kind in _INTS and dtype.is_integer() and isinstance(value, int):
        return True, int(value)
    if kind == "String" and isinstance(dtype, pl.String) and isinstance(value, str):
        return True, value
    if kind == "Boolean" and isinstance(dtype, pl.Boolean) and isinstance(value, bool):
        return True, value
    if kind == "Date" and isinstance(dtype, pl.Date) and isinstance(value, int):
        return True, date(1970, 1, 1) + timedelta(days=value)
    if kind == "Datetime" and isinstance(dtype, pl.Datetime) and isinstance(value, list):
        return _datetime(value, dtype)
    return False, None


def _datetime(value: list[Any], dtype: pl.Datetime) -> tuple[bool, Any]:
    """A polars datetime scalar `[epoch value, unit, zone]` as a python datetime (exact to the
    microsecond; aware in UTC for a zoned column, naive UTC wall clock otherwise)."""
    if len(value) != 3 or not isinstance(value[0], int):
        return False, None
    raw, unit, zone = value
    if unit == "Nanoseconds":
        if raw % 1000:
            return False, None  # not representable in microseconds: not pushed
        micros = raw // 1000
    elif unit in _TO_MICROS:
        micros = raw * _TO_MICROS[unit]
    else:
        return False, None
    if (zone is None) != (dtype.time_zone is None):
        return False, None
    moment = _EPOCH + timedelta(microseconds=micros)  # the epoch value is the UTC instant
    return True, moment if zone is None else moment.replace(tzinfo=UTC)


def _literal_list(node: Any, dtype: Any) -> tuple[tuple[Any, ...], bool] | None:
    """(the non-null values of an `is_in` literal list, whether it held a null), or None."""
    if not _pushable_dtype(dtype) or isinstance(dtype, pl.Datetime):
        return None
    try:
        raw = node["Literal"]["Scalar"]["List"]
        series = pl.read_ipc_stream(io.BytesIO(bytes(raw))).to_series()
    except Exception:
        return None
    if series.dtype != dtype and not (series.dtype.is_integer() and dtype.is_integer()):
        return None
    values = series.to_list()
    return tuple(v for v in values if v is not None), None in values


__all__ = ["AnyOf", "Compare", "InList", "Nullness", "Term", "pushable_terms"]
