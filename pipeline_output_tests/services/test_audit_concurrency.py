"""Two concurrent audited writers of one dataset, as real processes (issue 15): each stages its
upsert on its own audit branch and publishes; both publish in turn, or one fails clearly with
`AuditConflict` (main moved after it branched) — never one over the other. Nothing is lost: main's
history is exactly the published snapshots, one after the other, and the table equals the
published writes applied in that order by a polars oracle."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import polars as pl

from pipeline_output import DatasetSpec
from pipeline_output.stores.iceberg.table.tables import ancestry, head
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.processes import run_workers
from pipeline_output_tests.publishers import make_publisher

SPEC = DatasetSpec(name="shared", primary_key=("id",), strategy="snapshot_replace")
# (keys of writer 0, keys of writer 1, whether both stage before either publishes)
ROUNDS = [
    (list(range(0, 30)), list(range(20, 50)), True),
    (list(range(40, 70)), list(range(60, 90)), False),
    (list(range(5, 25)), list(range(15, 35)), True),
]


def frame(ids: list[int], writer: int, round_no: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "by": [f"w{writer}r{round_no}"] * len(ids),
        }
    )


def _worker(writer: int, catalog_props: dict[str, str], url: str, barrier: Any, out: Any) -> None:
    try:
        from pipeline_output.errors import AuditConflict
        from pipeline_output.services.audit import publish_audit
        from pipeline_output.services.publish import ResolvedMode
        from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

        pub = make_publisher(url, FlatSqlCatalog("default", **catalog_props))
        outcomes = []
        for n, (keys_a, keys_b, together) in enumerate(ROUNDS):
            run_id = f"w{writer}-r{n}"
            barrier.wait(timeout=120)
            pub.publish(
                SPEC,
                frame(keys_a if writer == 0 else keys_b, writer, n),
                mode=ResolvedMode("iceberg", "run config"),
                run_id=run_id,
                audit=True,
            )
            if together:
                barrier.wait(timeout=120)
            try:
                done = publish_audit(pub, SPEC, run_id=run_id)
                assert done is not None
                outcomes.append((run_id, "published", done.snapshot_id))
            except AuditConflict as exc:
                outcomes.append((run_id, "conflict", str(exc)))
        out.put((writer, outcomes, None))
    except BaseException as exc:
        barrier.abort()
        out.put((writer, [], f"{type(exc).__name__}: {exc}"))


def test_two_concurrent_audited_writers_publish_in_turn_or_fail_clearly_and_lose_nothing(
    pg_db_url, catalog
):
    pub = make_publisher(pg_db_url, catalog)
    base = frame(list(range(0, 100, 3)), writer=9, round_no=0)
    pub.publish(SPEC, base, mode=pub.resolve(SPEC, override="iceberg"), run_id="base")
    props = {k: str(v) for k, v in catalog.properties.items()}
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(w, props, pg_db_url, barrier, out)) for w in (0, 1)]
    results: dict[int, list[Any]] = {
        writer: outcomes for writer, outcomes, _ in run_workers(procs, out, timeout=300)
    }

    outcomes = {run: (state, detail) for rs in results.values() for run, state, detail in rs}
    for n, (_, _, together) in enumerate(ROUNDS):
        states = sorted(outcomes[f"w{w}-r{n}"][0] for w in (0, 1))
        if together:  # both branched from the same main: exactly one may publish
            assert states == ["conflict", "published"], (n, outcomes)
        else:
            assert "published" in states, (n, outcomes)
    for state, detail in outcomes.values():
        if state == "conflict":
            assert "main moved" in detail and "not published over it" in detail

    table = pub.iceberg.load(SPEC)
    lineage = list(reversed(list(ancestry(table, head(table)))))  # oldest first
    published = {detail: run for run, (state, detail) in outcomes.items() if state == "published"}
    runs = [s.summary.get("pipeline-output.run-id") for s in lineage]
    assert runs[0] == "base" and sorted(runs[1:]) == sorted(published.values())
    assert {s.snapshot_id for s in lineage[1:]} == set(published), "main is the published chain"

    expected = base
    for run in runs[1:]:
        writer, n = int(run[1]), int(run.split("-r")[1])
        keys = ROUNDS[n][writer]
        rows = frame(keys, writer, n)  # type: ignore[arg-type]
        expected = pl.concat([expected.join(rows, on="id", how="anti"), rows])
    assert_same_multiset(pub.iceberg.read(SPEC), expected)
    for run, (state, _) in outcomes.items():
        audit = pub.ledger.audit_log.audit("shared", run)
        assert audit.state == ("published" if state == "published" else "failed")
