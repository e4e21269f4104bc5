"""The legacy arm: a dataset's rows as jsonb documents in `pipeline_output.dataset_rows`.

`store.PostgresStore` is the arm (its docstring has the transaction and the JSON encoding);
`types` maps polars columns to Postgres types and evolves the registered schema, `fragments`
holds the SQL pieces (key, typed value, window), `staging` COPYs a batch and applies a write mode
with set-based SQL, `pending` is a write stopped before its commit.
"""

from __future__ import annotations

from pipeline_output.stores.postgres.fragments import ROWS_TABLE
from pipeline_output.stores.postgres.pending import PendingWrite
from pipeline_output.stores.postgres.store import PostgresStore
from pipeline_output.stores.postgres.types import evolve_schema, staged_type

__all__ = ["ROWS_TABLE", "PendingWrite", "PostgresStore", "evolve_schema", "staged_type"]
