"""`Ledger`: the Postgres control plane on one database — one log per record type, each an
attribute of the `Ledger` whose class lives in this module (the deploy log's in `deploys.py`):
`registry` (datasets), `deploy_log` (deploys), `flip_log` (mode flips), `parity_log` (parity
results), `audit_log` (write-audit-publish audits), `rollback_log`, `drain_log`; the window ledger
is `window_ledger.WindowLedger`. `Ledger` itself owns what spans several logs:
migrations, a divergence (a deploy and a parity result in one transaction), the datasets the control
plane knows of.

Every method opens its own short transaction, or joins the caller's when given `conn=`. All SQL is
composed with `psycopg.sql` and placeholders; no value is ever formatted into a query. The
freshness oracle of the legacy arm is `deploy_log.has_succeeded_deploy(dataset, "pg")` — never a
row count.

The dataset registry: each dataset's key and the Arrow schema the legacy arm restores types
from (`RegisteredDataset`, table `datasets`).

The flip log: a dataset's persisted mode and its history (`FlipRecord`, tables `mode_flips`
and `dataset_modes`) — `pipeline-output flip`.

The parity log: each parity check of a dataset's two arms (`ParityRecord`, table
`parity_results`).

The drain log: when the legacy arm of a dataset was drained at the end of its migration (table
`drains`) — `pipeline-output drain`.

The rollback log: each rollback of a dataset's native table (`RollbackRecord`, table
`rollbacks`). `services/time_travel.py` decides, this module only records.

The consumed-changes log of incremental downstreams: each range (from, to] of an upstream's
snapshots a downstream consumed, and the downstream snapshot that applied it (`ConsumedRange`,
table `consumed_changes`, migration 030), and the range a run is reading now (table
`consuming_changes`, migration 031: `reading`, cleared by the range's `record`).
`services/incremental.py` decides, this module only records; expiry keeps every upstream
snapshot a downstream's position names (`positions_of`) and every `to` a run is reading or was
killed reading (`reading_of`).

The audit log of write-audit-publish: audited runs and the writes they staged (`AuditRecord`,
`AuditWrite`; tables `audits`, `audit_writes`, migration 020). `services/audit.py` decides, this
module only records.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Unpack, get_args

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.types.json import Jsonb

from pipeline_output.contract.spec import MODES, check_identifier
from pipeline_output.errors import InvalidArgument, UnknownMode
from pipeline_output.infra import locks, pgsession
from pipeline_output.ledger import migrations
from pipeline_output.ledger.connection import (
    ControlPlaneDb,
    RecordLog,
    column_list,
    columns_of,
    ledger_table,
)
from pipeline_output.ledger.deploys import DeployFields, DeployLog, DeployRecord

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
    ("consumed_changes", "dataset"),
    ("consuming_changes", "dataset"),
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
        self.consumed_log = ConsumedLog(db)

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

    def record_divergence(self, dataset: str, **fields: Unpack[DeployFields]) -> DeployRecord:
        """The Postgres commit failed after the Iceberg commit of a `dual` write: record both a
        `diverged` legacy deploy (`fields`, its `error` saying why) and a failed parity result
        (so status and drain see it)."""
        snapshot_id = fields.get("snapshot_id")
        with self._db.tx(None) as c:
            record = self.deploy_log.record_deploy(
                dataset, "pg", status="diverged", conn=c, **fields
            )
            self.parity_log.record_parity(
                dataset,
                passed=False,
                pg_count=None,
                iceberg_count=None,
                run_id=fields.get("run_id"),
                details={
                    "reason": "diverged",
                    "error": fields.get("error"),
                    "deploy_id": record.id,
                    "iceberg_snapshot_id": snapshot_id,
                },
                conn=c,
            )
        return record


@dataclass(frozen=True)
class RegisteredDataset:
    """A dataset in the registry: its key and the Arrow schema the legacy arm restores types from."""

    name: str
    primary_key: tuple[str, ...]
    arrow_schema: pa.Schema | None
    created_at: datetime
    updated_at: datetime


class Registry(RecordLog):
    """The registry (see the module docstring)."""

    def register_dataset(
        self,
        name: str,
        *,
        primary_key: Sequence[str],
        arrow_schema: pa.Schema | None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> None:
        """Insert or update a dataset's registry entry (key and serialized Arrow schema)."""
        check_identifier(name, what="dataset name")
        blob = arrow_schema.serialize().to_pybytes() if arrow_schema is not None else None
        readable = (
            Jsonb({f.name: str(f.type) for f in arrow_schema}) if arrow_schema is not None else None
        )
        query = sql.SQL(
            "INSERT INTO {} AS d (name, primary_key, arrow_schema, schema_text)"
            " VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET primary_key = EXCLUDED.primary_key,"
            " arrow_schema = coalesce(EXCLUDED.arrow_schema, d.arrow_schema),"
            " schema_text = coalesce(EXCLUDED.schema_text, d.schema_text),"
            " updated_at = clock_timestamp()"
        ).format(ledger_table("datasets"))
        with self.tx(conn) as c:
            c.execute(query, (name, list(primary_key), blob, readable))

    def registered(
        self, name: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> RegisteredDataset | None:
        """The registry entry of `name`, or None."""
        query = sql.SQL(
            "SELECT name, primary_key, arrow_schema, created_at, updated_at FROM {} WHERE name = %s"
        ).format(ledger_table("datasets"))
        with self.tx(conn) as c:
            row = c.execute(query, (name,)).fetchone()
        if row is None:
            return None
        schema = pa.ipc.read_schema(pa.py_buffer(bytes(row[2]))) if row[2] is not None else None
        return RegisteredDataset(row[0], tuple(row[1]), schema, row[3], row[4])

    def dataset_schema(
        self, name: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> pa.Schema | None:
        """The registered Arrow schema of `name`, or None."""
        entry = self.registered(name, conn=conn)
        return entry.arrow_schema if entry is not None else None


@dataclass(frozen=True)
class FlipRecord:
    """One mode flip: who moved the dataset from which mode to which, when and why."""

    id: int
    dataset: str
    from_mode: str | None
    to_mode: str
    who: str
    at: datetime
    reason: str | None


FLIP_COLUMNS = columns_of(FlipRecord)


class FlipLog(RecordLog):
    """Mode flips (see the module docstring)."""

    def flip(self, dataset: str, mode: str, *, who: str, reason: str | None = None) -> FlipRecord:
        """Persist `dataset`'s mode (pg | iceberg | dual) with history; returns the history row."""
        if mode not in MODES:
            raise UnknownMode(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        check_identifier(dataset, what="dataset name")
        if not who:
            raise InvalidArgument("a flip needs `who` (the person or process flipping)")
        with self.tx(None) as c:
            locks.acquire(c, locks.mode_flip(dataset), transaction=True)
            current = self.current_flip(dataset, conn=c)
            row = c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, from_mode, to_mode, who, reason)"
                    " VALUES (%s, %s, %s, %s, %s) RETURNING {}"
                ).format(ledger_table("mode_flips"), column_list(FLIP_COLUMNS)),
                (dataset, current, mode, who, reason),
            ).fetchone()
            assert row is not None
            record = FlipRecord(*row)
            c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, mode, flip_id) VALUES (%s, %s, %s)"
                    " ON CONFLICT (dataset) DO UPDATE SET mode = EXCLUDED.mode,"
                    " flip_id = EXCLUDED.flip_id, updated_at = clock_timestamp()"
                ).format(ledger_table("dataset_modes")),
                (dataset, mode, record.id),
            )
        return record

    def current_flip(
        self, dataset: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> str | None:
        """The persisted mode of `dataset`, or None when it was never flipped."""
        rows = self.select(
            "dataset_modes", ["mode"], where={"dataset": dataset}, order="dataset", conn=conn
        )
        return str(rows[0][0]) if rows else None

    def flips(self) -> dict[str, str]:
        """Every persisted flip: dataset -> mode."""
        query = sql.SQL("SELECT dataset, mode FROM {} ORDER BY dataset").format(
            ledger_table("dataset_modes")
        )
        with self.tx(None) as c:
            return {str(d): str(m) for d, m in c.execute(query).fetchall()}

    def flip_history(self, dataset: str) -> list[FlipRecord]:
        """Every flip of `dataset`, oldest first."""
        rows = self.select("mode_flips", FLIP_COLUMNS, where={"dataset": dataset})
        return [FlipRecord(*r) for r in rows]


@dataclass(frozen=True)
class ParityRecord:
    """One parity check of a dataset's two arms."""

    id: int
    dataset: str
    at: datetime
    run_id: str | None
    passed: bool
    pg_count: int | None
    iceberg_count: int | None
    differing_keys: dict[str, Any]
    details: dict[str, Any]


PARITY_COLUMNS = columns_of(ParityRecord)


class ParityLog(RecordLog):
    """Parity results (see the module docstring)."""

    def record_parity(
        self,
        dataset: str,
        *,
        passed: bool,
        pg_count: int | None,
        iceberg_count: int | None,
        differing_keys: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        details: Mapping[str, Any] | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> ParityRecord:
        """Record one parity check (`differing_keys`: e.g. {"only_in_pg": [...], ...})."""
        query = sql.SQL(
            "INSERT INTO {} (dataset, run_id, passed, pg_count, iceberg_count, differing_keys,"
            " details) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {}"
        ).format(ledger_table("parity_results"), column_list(PARITY_COLUMNS))
        params = (
            dataset,
            run_id,
            passed,
            pg_count,
            iceberg_count,
            Jsonb(dict(differing_keys or {})),
            Jsonb(dict(details or {})),
        )
        with self.tx(conn) as c:
            row = c.execute(query, params).fetchone()
        assert row is not None
        return ParityRecord(*row)

    def last_parity(
        self, dataset: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> ParityRecord | None:
        """The most recent parity result of `dataset`, or None."""
        rows = self.select(
            "parity_results",
            PARITY_COLUMNS,
            where={"dataset": dataset},
            newest_first=True,
            conn=conn,
        )
        return ParityRecord(*rows[0]) if rows else None


class DrainLog(RecordLog):
    """Drains of the legacy arm (see the module docstring)."""

    def record_drain(self, dataset: str, *, rows: int) -> None:
        """Record that the legacy rows of `dataset` were deleted."""
        with self.tx(None) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {} (dataset, rows) VALUES (%s, %s)").format(
                    ledger_table("drains")
                ),
                (dataset, rows),
            )

    def last_drain(self, dataset: str) -> datetime | None:
        """When the legacy rows of `dataset` were last drained (None: never, since 020)."""
        with self.tx(None) as conn:
            row = conn.execute(
                sql.SQL("SELECT max(at) FROM {} WHERE dataset = %s").format(ledger_table("drains")),
                (dataset,),
            ).fetchone()
        return row[0] if row else None


@dataclass(frozen=True)
class RollbackRecord:
    """One rollback of a dataset's native table."""

    id: int
    dataset: str
    from_snapshot_id: int | None
    to_snapshot_id: int
    who: str
    run_id: str | None
    reason: str | None
    windows_reset: int
    at: datetime


_ROLLBACK_COLUMNS = [
    "id",
    "dataset",
    "from_snapshot_id",
    "to_snapshot_id",
    "who",
    "run_id",
    "reason",
    "windows_reset",
    "at",
]


class RollbackLog(RecordLog):
    """Rollbacks (see the module docstring)."""

    def record_rollback(
        self,
        dataset: str,
        *,
        from_snapshot_id: int | None,
        to_snapshot_id: int,
        who: str,
        run_id: str | None,
        reason: str | None,
        windows_reset: int,
        conn: psycopg.Connection[Any] | None = None,
    ) -> RollbackRecord:
        """Record a rollback (who, when, why, from, to, windows reset)."""
        with self.tx(conn) as c:
            row = c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, from_snapshot_id, to_snapshot_id, who, run_id, "
                    "reason, windows_reset) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {}"
                ).format(ledger_table("rollbacks"), column_list(_ROLLBACK_COLUMNS)),
                (dataset, from_snapshot_id, to_snapshot_id, who, run_id, reason, windows_reset),
            ).fetchone()
        assert row is not None
        return RollbackRecord(*row)

    def rollbacks(self, dataset: str) -> list[RollbackRecord]:
        """A dataset's rollbacks, oldest first."""
        rows = self.select("rollbacks", _ROLLBACK_COLUMNS, where={"dataset": dataset})
        return [RollbackRecord(*r) for r in rows]


@dataclass(frozen=True)
class ConsumedRange:
    """One range (from, to] of `upstream`'s snapshots `dataset` consumed (see the module
    docstring)."""

    id: int
    dataset: str
    upstream: str
    from_snapshot: int | None
    to_snapshot: int
    downstream_snapshot: int | None
    full_refresh: bool
    run_id: str | None
    recorded_at: datetime


class ConsumedLog(RecordLog):
    """Ranges of upstream changes incremental downstreams consumed (see the module docstring)."""

    def record(
        self,
        dataset: str,
        upstream: str,
        *,
        from_snapshot: int | None,
        to_snapshot: int,
        downstream_snapshot: int | None,
        full_refresh: bool,
        run_id: str | None,
    ) -> ConsumedRange:
        """Record that `dataset` consumed (from, to] of `upstream` (idempotent per downstream
        snapshot: a repair of an already recorded one returns it)."""
        if downstream_snapshot is not None:
            found = self.select(
                "consumed_changes",
                columns_of(ConsumedRange),
                where={
                    "dataset": dataset,
                    "upstream": upstream,
                    "downstream_snapshot": downstream_snapshot,
                },
            )
            if found:
                return ConsumedRange(*found[0])
        with self.tx(None) as c:
            c.execute(  # the run's range is recorded: no longer one being read
                sql.SQL("DELETE FROM {} WHERE dataset = %s AND upstream = %s").format(
                    ledger_table("consuming_changes")
                ),
                (dataset, upstream),
            )
            row = c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, upstream, from_snapshot, to_snapshot, "
                    "downstream_snapshot, full_refresh, run_id) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                    "RETURNING {}"
                ).format(ledger_table("consumed_changes"), column_list(columns_of(ConsumedRange))),
                (
                    dataset,
                    upstream,
                    from_snapshot,
                    to_snapshot,
                    downstream_snapshot,
                    full_refresh,
                    run_id,
                ),
            ).fetchone()
        assert row is not None
        return ConsumedRange(*row)

    def reading(self, dataset: str, upstream: str, *, to_snapshot: int, run_id: str | None) -> None:
        """Note that a run of `dataset` reads `upstream`'s changes up to `to_snapshot` (before it
        reads: expiry keeps that snapshot until the range is recorded, `record`)."""
        with self.tx(None) as c:
            c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, upstream, to_snapshot, run_id) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT (dataset, upstream) DO UPDATE SET "
                    "to_snapshot = EXCLUDED.to_snapshot, run_id = EXCLUDED.run_id, "
                    "started_at = clock_timestamp()"
                ).format(ledger_table("consuming_changes")),
                (dataset, upstream, to_snapshot, run_id),
            )

    def reading_of(self, upstream: str) -> dict[str, int]:
        """Per downstream of `upstream` with a run reading its changes now (or killed while it
        did, before its range was recorded), the `to` that run reads up to."""
        query = sql.SQL("SELECT dataset, to_snapshot FROM {} WHERE upstream = %s").format(
            ledger_table("consuming_changes")
        )
        with self.statement(None) as c:  # one statement: no transaction around it
            return {str(r[0]): int(r[1]) for r in c.execute(query, (upstream,)).fetchall()}

    @contextmanager
    def consume_lock(self, dataset: str) -> Iterator[None]:
        """Serialize the runs of one incremental downstream (held by the running process)."""
        with locks.held(self._db.url, locks.consume_changes(dataset)):
            yield

    def last(self, dataset: str, upstream: str) -> ConsumedRange | None:
        """The newest range `dataset` consumed of `upstream` (None: never)."""
        rows = self.select(
            "consumed_changes",
            columns_of(ConsumedRange),
            where={"dataset": dataset, "upstream": upstream},
            newest_first=True,
            limit=1,
        )
        return ConsumedRange(*rows[0]) if rows else None

    def history(self, dataset: str) -> list[ConsumedRange]:
        """Every range `dataset` consumed, oldest first."""
        rows = self.select(
            "consumed_changes", columns_of(ConsumedRange), where={"dataset": dataset}
        )
        return [ConsumedRange(*r) for r in rows]

    def consumed(self, upstream: str) -> bool:
        """Whether any downstream has consumed `upstream`'s changes (once it ran: its writes then
        record their change files under the `auto` default, `IcebergStore(change_consumers=)`)."""
        query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE upstream = %s)").format(
            ledger_table("consumed_changes")
        )
        with self.tx(None) as c:
            row = c.execute(query, (upstream,)).fetchone()
        return bool(row is not None and row[0])

    def positions_of(self, upstream: str) -> dict[str, int]:
        """Per downstream of `upstream`, the snapshot its next run reads the changes from (the
        `to` of its newest range): the snapshots expiry keeps unless forced."""
        query = sql.SQL(
            "SELECT DISTINCT ON (dataset) dataset, to_snapshot FROM {} WHERE upstream = %s "
            "ORDER BY dataset, id DESC"
        ).format(ledger_table("consumed_changes"))
        with self.statement(None) as c:  # one statement: no transaction around it
            return {str(r[0]): int(r[1]) for r in c.execute(query, (upstream,)).fetchall()}


AuditState = Literal["staged", "published", "failed", "dropped"]
AUDIT_STATES: tuple[str, ...] = get_args(AuditState)


@dataclass(frozen=True)
class AuditRecord:
    """One audited run of one dataset."""

    id: int
    dataset: str
    run_id: str
    branch: str
    mode: str
    state: AuditState
    base_snapshot_id: int | None  # main's snapshot the branch started from
    snapshot_id: int | None  # the branch head: what a publish makes main
    gating_checks: list[str]
    reason: str | None
    staged_at: datetime
    decided_at: datetime | None


@dataclass(frozen=True)
class AuditWrite:
    """One write an audit staged (in order)."""

    seq: int
    snapshot_id: int | None  # None: the write changed nothing
    strategy: str  # the strategy it was written with (a restatement: replace)
    window_key: str | None = None  # the window it was written for (its write window)
    marker: str | None = None  # the window attempt, or the audit item's own marker
    result: dict[str, Any] = field(default_factory=dict)
    frame: bytes | None = None  # dual: the checked frame (Arrow IPC), replayed on the legacy arm


_AUDIT_COLUMNS = [
    "id",
    "dataset",
    "run_id",
    "branch",
    "mode",
    "state",
    "base_snapshot_id",
    "snapshot_id",
    "gating_checks",
    "reason",
    "staged_at",
    "decided_at",
]
_WRITE_COLUMNS = ["seq", "snapshot_id", "strategy", "window_key", "marker"]


def _audit(row: Sequence[Any]) -> AuditRecord:
    values = dict(zip(_AUDIT_COLUMNS, row, strict=True))
    values["gating_checks"] = list(values["gating_checks"] or [])
    return AuditRecord(**values)


class AuditLog(RecordLog):
    """Audited runs and their staged writes (see the module docstring).

    A run decides once whether it audits a dataset (the spec's `audit`, or the run's override):
    a write of `run_id` to `dataset` that this process made unaudited (`note_unaudited`) means
    the run staged no audit of it, so `audit` answers None for it without a query (the checks
    and hooks after an unaudited write then cost no round trip). A staged write of the pair
    forgets the note."""

    _NOTED = 1024  # (dataset, run_id) pairs remembered

    def __init__(self, db: ControlPlaneDb) -> None:
        super().__init__(db)
        self._unaudited: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._guard = threading.Lock()

    def note_unaudited(self, dataset: str, run_id: str | None) -> None:
        """This process writes `dataset` in run `run_id` without an audit."""
        if run_id is None:
            return
        with self._guard:
            self._unaudited[(dataset, run_id)] = None
            self._unaudited.move_to_end((dataset, run_id))
            while len(self._unaudited) > self._NOTED:
                self._unaudited.popitem(last=False)

    def stage_write(
        self,
        dataset: str,
        *,
        run_id: str,
        branch: str,
        mode: str,
        base_snapshot_id: int | None,
        write: AuditWrite,
    ) -> AuditRecord:
        """Record one staged write of `run_id`'s audit of `dataset` (the audit row is created by
        its first write; the branch head moves to the write's snapshot when it made one, and the
        base — main's snapshot the branch started from — is the parent of the first one)."""
        with self._guard:
            self._unaudited.pop((dataset, run_id), None)
        with self.tx(None) as conn:
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {t} (dataset, run_id, branch, mode, base_snapshot_id, "
                    "snapshot_id) VALUES (%s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (dataset, run_id) DO UPDATE SET "
                    "snapshot_id = coalesce(EXCLUDED.snapshot_id, {t}.snapshot_id), "
                    "base_snapshot_id = CASE WHEN {t}.snapshot_id IS NULL "
                    "THEN EXCLUDED.base_snapshot_id ELSE {t}.base_snapshot_id END "
                    "RETURNING {cols}"
                ).format(t=ledger_table("audits"), cols=column_list(_AUDIT_COLUMNS)),
                (dataset, run_id, branch, mode, base_snapshot_id, write.snapshot_id),
            ).fetchone()
            assert row is not None
            record = _audit(row)
            if record.state != "staged":
                raise InvalidArgument(
                    f"dataset {dataset!r}: the audit of run {run_id} is already {record.state}; "
                    "a decided audit takes no more writes"
                )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (audit_id, seq, snapshot_id, strategy, window_key, "
                    "marker, result, frame) SELECT %s, coalesce(max(seq), 0) + 1, "
                    "%s, %s, %s, %s, %s, %s FROM {} WHERE audit_id = %s"
                ).format(ledger_table("audit_writes"), ledger_table("audit_writes")),
                (
                    record.id,
                    write.snapshot_id,
                    write.strategy,
                    write.window_key,
                    write.marker,
                    Jsonb(write.result),
                    write.frame,
                    record.id,
                ),
            )
        return record

    def set_gating_checks(self, audit_id: int, checks: Sequence[str]) -> None:
        """The blocking checks that must pass before the audit publishes."""
        with self.tx(None) as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET gating_checks = %s WHERE id = %s").format(
                    ledger_table("audits")
                ),
                (sorted(set(checks)), audit_id),
            )

    def audit(self, dataset: str, run_id: str) -> AuditRecord | None:
        """The audit of `run_id`'s writes to `dataset`, if that run staged any (None without a
        query after this process's unaudited write of the pair: `note_unaudited`)."""
        with self._guard:
            if (dataset, run_id) in self._unaudited:
                return None
        rows = self.select("audits", _AUDIT_COLUMNS, where={"dataset": dataset, "run_id": run_id})
        return _audit(rows[0]) if rows else None

    def audits(
        self, dataset: str | None = None, *, states: Sequence[str] | None = None
    ) -> list[AuditRecord]:
        """Audits, newest first (optionally of one dataset, only in some states)."""
        where: list[sql.Composable] = []
        params: list[Any] = []
        if dataset is not None:
            where.append(sql.SQL("dataset = %s"))
            params.append(dataset)
        if states is not None:
            where.append(sql.SQL("state = ANY(%s)"))
            params.append(list(states))
        clause = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL("")
        with self.tx(None) as conn:
            rows = conn.execute(
                sql.SQL("SELECT {} FROM {}{} ORDER BY id DESC").format(
                    column_list(_AUDIT_COLUMNS), ledger_table("audits"), clause
                ),
                params,
            ).fetchall()
        return [_audit(r) for r in rows]

    def audits_of_run(self, run_id: str) -> list[AuditRecord]:
        """Every audit a run staged (one per dataset)."""
        return [_audit(r) for r in self.select("audits", _AUDIT_COLUMNS, where={"run_id": run_id})]

    def audit_writes(self, audit_id: int, *, frames: bool = False) -> list[AuditWrite]:
        """The writes an audit staged, in order (with the dual frames when `frames`)."""
        names = [*_WRITE_COLUMNS, "result", *(["frame"] if frames else [])]
        rows = self.select("audit_writes", names, where={"audit_id": audit_id}, order="seq")
        out = []
        for row in rows:
            values = dict(zip(names, row, strict=True))
            if values.get("frame") is not None:
                values["frame"] = bytes(values["frame"])
            out.append(AuditWrite(**values))
        return out

    def decide_audit(
        self,
        audit_id: int,
        state: AuditState,
        *,
        reason: str | None = None,
        from_states: Sequence[str] = ("staged",),
    ) -> bool:
        """Move an audit to `state` (only from `from_states`); False when it was not in one.
        Frames are no longer needed once decided and are dropped."""
        if state not in AUDIT_STATES:
            raise InvalidArgument(f"unknown audit state {state!r}; valid: {AUDIT_STATES}")
        with self.tx(None) as conn:
            row = conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = %s, reason = coalesce(%s, reason), "
                    "decided_at = clock_timestamp() WHERE id = %s AND state = ANY(%s) "
                    "RETURNING id"
                ).format(ledger_table("audits")),
                (state, reason[:2000] if reason else None, audit_id, list(from_states)),
            ).fetchone()
            if row is not None:
                conn.execute(
                    sql.SQL("UPDATE {} SET frame = NULL WHERE audit_id = %s").format(
                        ledger_table("audit_writes")
                    ),
                    (audit_id,),
                )
        return row is not None
