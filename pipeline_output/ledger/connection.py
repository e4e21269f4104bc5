"""`ControlPlaneDb`: connections to the control-plane database, shared by every record log of the
ledger (`RecordLog`). A log's method opens its own short transaction (on the process's pooled session), or joins the caller's when given `conn=`
(the legacy arm records its deploy in the same transaction as its rows); a method of one statement
(a select, a deploy record) runs it alone on the pooled autocommit session (`statement`).

Names in the control-plane schema `pipeline_output`, composed with `psycopg.sql`: a table of
the schema (`ledger_table`), a column list (`column_list`), a record's columns (`columns_of`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import fields
from typing import Any

import psycopg
from psycopg import sql

from pipeline_output.infra import pgsession
from pipeline_output.ledger import migrations


class ControlPlaneDb:
    """The control-plane database at `url` (a libpq URI)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection (not autocommit) to the control-plane database."""
        return pgsession.connect(self.url)

    @contextmanager
    def tx(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection (its transaction), or a transaction of its own on this
        process's pooled session (`pgsession.pooled`: no new connection per record), committed
        on success and rolled back on an exception."""
        if conn is not None:
            yield conn
            return
        with pgsession.pooled(self.url) as own, own.transaction():
            yield own

    @contextmanager
    def statement(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection (its transaction), or this process's pooled autocommit
        session, for ONE statement (atomic by itself: no transaction around it)."""
        if conn is not None:
            yield conn
            return
        with pgsession.pooled(self.url) as own:
            yield own


class RecordLog:
    """The base of every record log of the ledger: the database its records live in."""

    def __init__(self, db: ControlPlaneDb) -> None:
        self._db = db

    def select(
        self,
        table: str,
        columns: Sequence[str],
        *,
        where: Mapping[str, Any],
        newest_first: bool = False,
        order: str = "id",
        limit: int | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[tuple[Any, ...]]:
        """The `columns` of `table`'s rows whose columns equal `where`'s values, by `order` (at
        most `limit`)."""
        match = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in where)
        direction = sql.SQL("DESC" if newest_first else "ASC")
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} {} LIMIT %s").format(
            column_list(columns), ledger_table(table), match, sql.Identifier(order), direction
        )
        with self.statement(conn) as c:
            return c.execute(query, (*where.values(), limit)).fetchall()

    def tx(
        self, conn: psycopg.Connection[Any] | None
    ) -> AbstractContextManager[psycopg.Connection[Any]]:
        """The caller's connection, or a fresh one committed on success (`ControlPlaneDb.tx`)."""
        return self._db.tx(conn)

    def statement(
        self, conn: psycopg.Connection[Any] | None
    ) -> AbstractContextManager[psycopg.Connection[Any]]:
        """For one statement: the caller's connection (its transaction), or this process's
        pooled autocommit session — a single statement is atomic on its own, so it needs no
        BEGIN and COMMIT around it (`ControlPlaneDb.statement`)."""
        return self._db.statement(conn)


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
