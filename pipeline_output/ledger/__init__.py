"""The Postgres control plane: migrations and the `Ledger` (one log per record type).

SQL schema changes live in `sql/<NNN>_<name>.sql`, applied in order by `Ledger.migrate()`.
"""

from __future__ import annotations

from pipeline_output.contract.spec import ARMS
from pipeline_output.errors import UnknownMode
from pipeline_output.ledger.control_plane import Ledger
from pipeline_output.ledger.deploys import DEPLOY_STATUSES, DeployRecord
from pipeline_output.ledger.flips import FlipRecord
from pipeline_output.ledger.migrations import MigrationError
from pipeline_output.ledger.parity_results import ParityRecord
from pipeline_output.ledger.registry import RegisteredDataset

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
