"""The legacy arm: a dataset's rows as jsonb documents in `pipeline_output.dataset_rows`, written
with set-based SQL inside one transaction (`store.PostgresStore`'s docstring).
Its modules, by concept: `docs/concepts.md`, "Where each concept lives".
"""

from __future__ import annotations

from pipeline_output.stores.postgres.fragments import ROWS_TABLE
from pipeline_output.stores.postgres.pending import PendingWrite
from pipeline_output.stores.postgres.store import PostgresStore
from pipeline_output.stores.postgres.types import evolve_schema, staged_type

__all__ = ["ROWS_TABLE", "PendingWrite", "PostgresStore", "evolve_schema", "staged_type"]
