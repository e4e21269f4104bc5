"""`ControlPlaneDb`: connections to the control-plane database, shared by every record log of the
ledger (`RecordLog`). A log's method opens its own short transaction, or joins the caller's when given `conn=`
(the legacy arm records its deploy in the same transaction as its rows)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from pipeline_output.infra import pgsession


class ControlPlaneDb:
    """The control-plane database at `url` (a libpq URI)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection (not autocommit) to the control-plane database."""
        return pgsession.connect(self.url)

    @contextmanager
    def tx(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection (its transaction), or a fresh one committed on success."""
        if conn is not None:
            yield conn
            return
        with pgsession.connect(self.url) as own:
            yield own


class RecordLog:
    """The base of every record log of the ledger: the database its records live in."""

    def __init__(self, db: ControlPlaneDb) -> None:
        self._db = db
