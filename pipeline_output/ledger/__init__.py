"""The Postgres control plane: the `Ledger` and its record logs, the watermark ledger, and the
schema's migrations (`sql/<NNN>_<name>.sql`, applied in order by `Ledger.migrate()`).
Its modules, by concept: `docs/concepts.md`, "Where each concept lives".
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
