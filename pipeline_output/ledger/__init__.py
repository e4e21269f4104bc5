"""The Postgres control plane: migrations and the `Ledger` (registry, deploys, flips, parity).

SQL schema changes live in `sql/NNN_name.sql`, applied in order by `Ledger.migrate()`.
"""

from __future__ import annotations

from pipeline_output.errors import UnknownMode
from pipeline_output.ledger.control_plane import Ledger
from pipeline_output.ledger.migrations import MigrationError
from pipeline_output.ledger.records import (
    ARMS,
    DEPLOY_STATUSES,
    DeployRecord,
    FlipRecord,
    ParityRecord,
    RegisteredDataset,
)

__all__ = [
    "ARMS",
    "DEPLOY_STATUSES",
    "DeployRecord",
    "FlipRecord",
    "Ledger",
    "MigrationError",
    "ParityRecord",
    "RegisteredDataset",
    "UnknownMode",
]
