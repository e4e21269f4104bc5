"""`Arms`: what a use case works with — the two stores and the control-plane ledger.

Use cases take `Arms`, not the `Publisher`: a `Publisher` carries them (and so does the runtime's
publisher), but a use case such as write-audit-publish or rollback needs the stores and the ledger,
not the publish pipeline, and importing the pipeline from them would tie the two in a cycle.
"""

from __future__ import annotations

from typing import Protocol

from pipeline_output.ledger.control_plane import Ledger
from pipeline_output.stores.iceberg import IcebergStore
from pipeline_output.stores.postgres import PostgresStore


class Arms(Protocol):
    """The native store, the legacy store (None where a deployment has none) and the ledger."""

    iceberg: IcebergStore
    postgres: PostgresStore | None
    ledger: Ledger | None
