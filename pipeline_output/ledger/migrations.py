"""Versioned, idempotent migrations of the control-plane schema `pipeline_output`.

Migrations are the files `sql/<NNN>_<name>.sql` next to this module, applied in version order. Each
applied file is recorded in `pipeline_output.schema_migrations` (version, name, sha256, time). A run
takes a transaction-level advisory lock first, so concurrent processes migrate one after the other:
the second finds everything applied and does nothing. All pending files and their records commit in
one transaction (Postgres DDL is transactional) — a failing file leaves the schema as it was.

An applied file whose content changed is refused (`MigrationError`): add a new file instead.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from pipeline_output.errors import MigrationError as MigrationError
from pipeline_output.infra import locks

SCHEMA = "pipeline_output"
MIGRATIONS_TABLE = "schema_migrations"
_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One SQL file: its version, name, text and checksum."""

    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        """sha256 of the file text."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def available() -> list[Migration]:
    """The migration files shipped with the package, in version order."""
    found: dict[int, Migration] = {}
    for entry in resources.files("pipeline_output.ledger").joinpath("sql").iterdir():
        match = _FILE.match(entry.name)
        if not match:
            if entry.name.endswith(".sql"):
                raise MigrationError(f"migration file {entry.name!r} is not named NNN_name.sql")
            continue
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"two migration files have version {version:03d}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Apply pending migrations on `conn` (committed here); returns the versions applied now.

    On an autocommit session outside a transaction, an up-to-date schema costs one statement:
    the applied records are read first, and the locked pass runs only when a file is not applied
    as shipped (or the table is not there)."""
    migrations = available()
    if _up_to_date(conn, migrations):
        return []
    applied_now: list[int] = []
    table = sql.Identifier(SCHEMA, MIGRATIONS_TABLE)
    with conn.transaction():
        locks.acquire(conn, locks.MIGRATIONS, transaction=True)
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(table)
        )
        rows = conn.execute(sql.SQL("SELECT version, name, checksum FROM {}").format(table))
        done = {int(v): (str(n), str(c)) for v, n, c in rows.fetchall()}
        for migration in migrations:
            if migration.version in done:
                name, checksum = done[migration.version]
                if checksum != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.version:03d}_{name} was applied with a different "
                        "content; never edit an applied migration, add a new file"
                    )
                continue
            try:
                conn.execute(migration.text.encode("utf-8"))
            except psycopg.Error as exc:
                raise MigrationError(
                    f"migration {migration.version:03d}_{migration.name} failed: {exc}"
                ) from exc
            conn.execute(
                sql.SQL("INSERT INTO {} (version, name, checksum) VALUES (%s, %s, %s)").format(
                    table
                ),
                (migration.version, migration.name, migration.checksum),
            )
            applied_now.append(migration.version)
    return applied_now


def _up_to_date(conn: psycopg.Connection[Any], migrations: list[Migration]) -> bool:
    """Every file of `migrations` recorded as applied with its checksum (read without the lock:
    a migration still in flight elsewhere is not visible, so the locked pass waits for it).
    False — the locked pass decides — on a session inside a transaction or not autocommit."""
    if not conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    query = sql.SQL("SELECT version, checksum FROM {}").format(
        sql.Identifier(SCHEMA, MIGRATIONS_TABLE)
    )
    try:
        done = {int(v): str(c) for v, c in conn.execute(query).fetchall()}
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return False
    return all(done.get(m.version) == m.checksum for m in migrations)


def applied(conn: psycopg.Connection[Any]) -> list[int]:
    """The versions recorded as applied (empty when the schema does not exist yet)."""
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{MIGRATIONS_TABLE}",)
    ).fetchone()
    if not exists or not exists[0]:
        return []
    rows = conn.execute(
        sql.SQL("SELECT version FROM {} ORDER BY version").format(
            sql.Identifier(SCHEMA, MIGRATIONS_TABLE)
        )
    ).fetchall()
    return [int(r[0]) for r in rows]
