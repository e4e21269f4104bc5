"""`Ledger`: the Postgres control plane on one database — one log per record type, each in its own
module beside its SQL: `registry` (datasets), `deploy_log` (deploys), `flip_log` (mode flips),
`parity_log` (parity results), `audit_log` (write-audit-publish audits), `rollback_log`, `drain_log`;
the window ledger is `window_ledger.WindowLedger`. `Ledger` itself owns what spans several logs:
migrations, a divergence (a deploy and a parity result in one transaction), the datasets the control
plane knows of.

Every method opens its own short transaction, or joins the caller's when given `conn=`. All SQL is
composed with `psycopg.sql` and placeholders; no value is ever formatted into a query. The
freshness oracle of the legacy arm is `deploy_log.has_succeeded_deploy(dataset, "pg")` — never a
row count.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from pipeline_output.contract.windows import Window
from pipeline_output.infra import pgsession
from pipeline_output.ledger import migrations
from pipeline_output.ledger.audits import AuditLog
from pipeline_output.ledger.connection import ControlPlaneDb
from pipeline_output.ledger.deploys import DeployLog, DeployRecord
from pipeline_output.ledger.drains import DrainLog
from pipeline_output.ledger.flips import FlipLog
from pipeline_output.ledger.parity_results import ParityLog
from pipeline_output.ledger.registry import Registry
from pipeline_output.ledger.rollbacks import RollbackLog
from pipeline_output.ledger.sql_names import ledger_table

# Every record the control plane keeps of a dataset: (table, the column naming the dataset), in an
# order that deletes referencing rows first (a current mode points at its flip; an audit's writes
# go with it, ON DELETE CASCADE). A migration adding a per-dataset table adds it here.
PER_DATASET = (
    ("dataset_modes", "dataset"),
    ("mode_flips", "dataset"),
    ("deploys", "dataset"),
    ("windows", "dataset"),
    ("parity_results", "dataset"),
    ("audits", "dataset"),
    ("rollbacks", "dataset"),
    ("drains", "dataset"),
    ("dataset_rows", "dataset_id"),
    ("datasets", "name"),
)


class Ledger:
    """The control plane on one Postgres database (`url`), schema `pipeline_output`."""

    def __init__(self, url: str) -> None:
        self.url = url
        db = ControlPlaneDb(url)
        self._db = db
        self.registry = Registry(db)
        self.deploy_log = DeployLog(db)
        self.flip_log = FlipLog(db)
        self.parity_log = ParityLog(db)
        self.audit_log = AuditLog(db)
        self.rollback_log = RollbackLog(db)
        self.drain_log = DrainLog(db)

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection (not autocommit) to the control-plane database."""
        return self._db.connect()

    def migrate(self) -> list[int]:
        """Apply pending migrations (safe to call from many processes); returns versions applied."""
        with pgsession.connect(self.url) as conn:
            return migrations.migrate(conn)

    def applied_migrations(self) -> list[int]:
        """Versions recorded in `pipeline_output.schema_migrations`."""
        with pgsession.connect(self.url) as conn:
            return migrations.applied(conn)

    def datasets(self) -> list[str]:
        """Every dataset the control plane knows of (registry, deploys, flips, parity), sorted."""
        query = sql.SQL(
            "SELECT name FROM {} UNION SELECT dataset FROM {} UNION SELECT dataset FROM {}"
            " UNION SELECT dataset FROM {} ORDER BY 1"
        ).format(
            ledger_table("datasets"),
            ledger_table("deploys"),
            ledger_table("mode_flips"),
            ledger_table("parity_results"),
        )
        with self._db.tx(None) as c:
            return [str(r[0]) for r in c.execute(query).fetchall()]

    def forget(
        self, dataset: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> dict[str, int]:
        """Delete every record of `dataset` (`PER_DATASET`: registry, deploys, flips, parity,
        windows, audits, rollbacks, drains and its legacy rows) in one transaction, so that a
        dataset given the name later starts clean; the rows deleted per table (none left out)."""
        removed = {}
        with self._db.tx(conn) as c:
            for table, column in PER_DATASET:
                query = sql.SQL("DELETE FROM {} WHERE {} = %s").format(
                    ledger_table(table), sql.Identifier(column)
                )
                removed[table] = c.execute(query, (dataset,)).rowcount
        return removed

    def record_divergence(
        self,
        dataset: str,
        *,
        run_id: str | None,
        error: str,
        window: Window | str | None = None,
        snapshot_id: int | None = None,
        strategy: str | None = None,
        write_mode: str | None = None,
        started_at: datetime | None = None,
    ) -> DeployRecord:
        """The Postgres commit failed after the Iceberg commit of a `dual` write: record both a
        `diverged` legacy deploy and a failed parity result (so status and drain see it)."""
        with self._db.tx(None) as c:
            record = self.deploy_log.record_deploy(
                dataset,
                "pg",
                status="diverged",
                run_id=run_id,
                strategy=strategy,
                write_mode=write_mode,
                window=window,
                snapshot_id=snapshot_id,
                started_at=started_at,
                error=error,
                conn=c,
            )
            self.parity_log.record_parity(
                dataset,
                passed=False,
                pg_count=None,
                iceberg_count=None,
                run_id=run_id,
                details={
                    "reason": "diverged",
                    "error": error,
                    "deploy_id": record.id,
                    "iceberg_snapshot_id": snapshot_id,
                },
                conn=c,
            )
        return record
