"""Test harness: a publisher over both arms on a test database and catalog, a mode for one run, and
the legacy arm's stored documents read and edited by plain SQL (what a stray UPDATE does)."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from pipeline_output import IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.ledger import Ledger
from pipeline_output.services.publish import Publisher, ResolvedMode
from pipeline_output.stores.postgres import PostgresStore


def make_publisher(url: str, catalog: Any) -> Publisher:
    ledger = Ledger(url)
    ledger.migrate()
    return Publisher(
        iceberg=IcebergStore(catalog, "datasets", lock=AdvisoryLock(url)),
        postgres=PostgresStore(url, ledger=ledger),
        ledger=ledger,
    )


def mode(name: str, source: str = "run config") -> ResolvedMode:
    return ResolvedMode(name, source)  # type: ignore[arg-type]


def pg_docs(url: str, dataset: str) -> list[tuple[int, str | None, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT row_index, pk, data::text FROM pipeline_output.dataset_rows "
            "WHERE dataset_id = %s ORDER BY row_index",
            (dataset,),
        ).fetchall()
    return [(int(r[0]), r[1], str(r[2])) for r in rows]


def corrupt_pg_row(url: str, dataset: str, pk_text: str, column: str, value: Any) -> None:
    """Edit one stored document by plain SQL (what a stray UPDATE on the legacy table does)."""
    with psycopg.connect(url) as conn:
        cur = conn.execute(
            "UPDATE pipeline_output.dataset_rows SET data = jsonb_set(data, %s, %s::jsonb) "
            "WHERE dataset_id = %s AND pk = %s",
            ([column], json.dumps(value), dataset, pk_text),
        )
        assert cur.rowcount == 1, f"no legacy row {dataset}/{pk_text}"


def pg_deploy_ids(url: str, dataset: str) -> list[int]:
    return [d.id for d in Ledger(url).deploy_log.deploys(dataset, arm="pg")]
