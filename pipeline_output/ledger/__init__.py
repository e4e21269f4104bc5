"""The Postgres control plane: migrations and the `Ledger` (one log per record type).

SQL schema changes live in `sql/<NNN>_<name>.sql`, applied in order by `Ledger.migrate()`.
"""

from __future__ import annotations

from pipeline_output.contract.spec import ARMS
from pipeline_output.errors import UnknownMode
from pipeline_output.ledger.control_plane import FlipRecord, Ledger, ParityRecord, RegisteredDataset
from pipeline_output.ledger.deploys import DEPLOY_STATUSES, DeployRecord
from pipeline_output.ledger.migrations import MigrationError

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
