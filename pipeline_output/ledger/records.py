"""The control plane's records: deploys, flips, parity results, registered datasets, and the
column lists the `Ledger` selects them with (one list per record, next to its fields).

Declarations only (no I/O); `ledger.Ledger` reads and writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Literal, get_args

import pyarrow as pa
from psycopg import sql

from pipeline_output.contract.spec import ARMS as ARMS
from pipeline_output.contract.spec import Arm as Arm
from pipeline_output.ledger import migrations

DeployStatus = Literal["succeeded", "failed", "diverged"]
DEPLOY_STATUSES: tuple[str, ...] = get_args(DeployStatus)
SCHEMA = migrations.SCHEMA


def ledger_table(name: str) -> sql.Identifier:
    return sql.Identifier(SCHEMA, name)


@dataclass(frozen=True)
class DeployRecord:
    """One write to one arm, as the ledger recorded it."""

    id: int
    dataset: str
    arm: str
    run_id: str | None
    strategy: str | None
    write_mode: str | None
    first_deploy: bool | None
    window: str | None
    window_key: str | None
    status: str
    rows_in: int | None
    rows_inserted: int | None
    rows_updated: int | None
    rows_deleted: int | None
    rows_unchanged: int | None
    rows_preserved: int | None
    rows_skipped: int | None
    rows_total_after: int | None
    snapshot_id: int | None
    started_at: datetime | None
    finished_at: datetime
    error: str | None
    attempt_marker: str | None = None  # the window attempt this write belongs to (migration 013)


def _names(record: type) -> list[str]:
    """A record's columns: its fields, in order (each record mirrors its table's SELECT list)."""
    return [f.name for f in fields(record)]


DEPLOY_COLUMNS = _names(DeployRecord)
DEPLOY_COUNTERS = [c for c in DEPLOY_COLUMNS if c.startswith("rows_")]


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


FLIP_COLUMNS = _names(FlipRecord)


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


PARITY_COLUMNS = _names(ParityRecord)


@dataclass(frozen=True)
class RegisteredDataset:
    """A dataset in the registry: its key and the Arrow schema the legacy arm restores types from."""

    name: str
    primary_key: tuple[str, ...]
    arrow_schema: pa.Schema | None
    created_at: datetime
    updated_at: datetime


def column_list(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)
