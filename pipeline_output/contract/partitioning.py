"""`partition_by` terms: what a dataset declares, parsed and validated when its spec is built.

A term is a column name (identity) or an Iceberg transform in the SQL spelling users of Spark and
Trino know: `year(c)`, `month(c)`, `day(c)`, `hour(c)`, `bucket(N, c)`, `truncate(W, c)`,
`identity(c)`. The native arm partitions its table by them (`stores/iceberg/table/partitions.py`); the
legacy row store has no physical layout, so the terms change nothing there (documented in
docs/concepts.md). Pure: no I/O, no pyiceberg.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pipeline_output.errors import InvalidSpec

Transform = Literal["identity", "year", "month", "day", "hour", "bucket", "truncate"]
_UNARY: tuple[Transform, ...] = ("identity", "year", "month", "day", "hour")
_SIZED: tuple[Transform, ...] = ("bucket", "truncate")
_TERM = re.compile(r"^\s*(?P<fn>[a-z]+)\s*\(\s*(?P<args>[^()]*)\)\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class PartitionTerm:
    """One partition field: `transform` applied to `column` (`size`: buckets or width)."""

    transform: Transform
    column: str
    size: int | None = None

    @property
    def field_name(self) -> str:
        """The partition field's name, as Spark names it (`id_bucket`, `ts_day`, `region`)."""
        return self.column if self.transform == "identity" else f"{self.column}_{self.transform}"

    def __str__(self) -> str:
        if self.transform == "identity":
            return self.column
        if self.size is not None:
            return f"{self.transform}({self.size}, {self.column})"
        return f"{self.transform}({self.column})"


def parse_term(text: str, *, dataset: str) -> PartitionTerm:
    """Parse one `partition_by` entry, or raise `InvalidSpec` naming the dataset and the term."""

    def bad(why: str) -> InvalidSpec:
        return InvalidSpec(
            f"dataset {dataset!r}: partition_by entry {text!r} {why}; write a column name or one "
            "of year(c), month(c), day(c), hour(c), bucket(N, c), truncate(W, c), identity(c)"
        )

    if not isinstance(text, str):
        raise bad("is not a string")
    if _NAME.match(text.strip()):
        return PartitionTerm("identity", text.strip())
    match = _TERM.match(text)
    if match is None:
        raise bad("is not a partition term")
    fn, args = match["fn"], [a.strip() for a in match["args"].split(",")]
    if fn in _UNARY and len(args) == 1 and _NAME.match(args[0]):
        return PartitionTerm(fn, args[0])
    if fn in _SIZED and len(args) == 2 and args[0].isdigit() and _NAME.match(args[1]):
        size = int(args[0])
        if size < 1:
            raise bad(f"has {fn} size {size}; it must be at least 1")
        return PartitionTerm(fn, args[1], size)
    if fn not in (*_UNARY, *_SIZED):
        raise bad(f"uses the unknown transform {fn!r}")
    raise bad(f"has the wrong arguments for {fn}")


def parse_terms(entries: tuple[str, ...], *, dataset: str) -> tuple[PartitionTerm, ...]:
    """Every entry parsed; the same field twice is refused."""
    terms = tuple(parse_term(e, dataset=dataset) for e in entries)
    names = [t.field_name for t in terms]
    if len(set(names)) != len(names):
        raise InvalidSpec(f"dataset {dataset!r}: partition_by repeats a field: {entries!r}")
    return terms
