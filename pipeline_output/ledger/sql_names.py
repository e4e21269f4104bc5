"""Names in the control-plane schema `pipeline_output`, composed with `psycopg.sql`: a table of
the schema (`ledger_table`), a column list (`column_list`), a record's columns (`columns_of`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from psycopg import sql

from pipeline_output.ledger import migrations

SCHEMA = migrations.SCHEMA


def ledger_table(name: str) -> sql.Identifier:
    """`pipeline_output.<name>`."""
    return sql.Identifier(SCHEMA, name)


def column_list(names: Sequence[str]) -> sql.Composed:
    """`a, b, c` as quoted identifiers."""
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def columns_of(record: type) -> list[str]:
    """A record's columns: its fields, in order (each record mirrors its table's SELECT list)."""
    return [f.name for f in fields(record)]
