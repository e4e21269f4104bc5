"""Model node memory: scoring a 2M-row source in batches of 100k vs loading it whole.

Each case runs in a fresh subprocess (peak RSS = the child's ru_maxrss) against the same source
table: an embedded Postgres (control plane + SQL catalog) and a local warehouse under
benchmarks/.work/. The "whole" case is the same code path with one batch holding every row, i.e.
what a model node without windowing does.

    python benchmarks/bench_model_memory.py [--rows 2000000] [--batch 100000]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

WORK = Path(__file__).resolve().parent / ".work" / "model_memory"


def _predict(frame):  # type: ignore[no-untyped-def]
    import polars as pl

    return frame.select(
        (pl.col("a") * 0.5 + pl.col("b").cast(pl.Float64) * 0.25).alias("score"),
        (pl.col("a") % 3 == 0).alias("flag"),
    )


def _setup(pg_url: str, rows: int) -> None:
    import polars as pl
    from pyiceberg.catalog.sql import SqlCatalog

    from pipeline_output import DatasetSpec, IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.infra.settings import to_sqlalchemy_url

    catalog = SqlCatalog(
        "default", uri=to_sqlalchemy_url(pg_url, driver="psycopg"), warehouse=f"file://{WORK}/wh"
    )
    store = IcebergStore(catalog, "bench", lock=AdvisoryLock(pg_url))
    frame = pl.DataFrame(
        {
            "id": pl.int_range(0, rows, eager=True),
            "a": pl.int_range(0, rows, eager=True) * 7 % 1000,
            "b": pl.int_range(0, rows, eager=True) % 97,
            "note": pl.int_range(0, rows, eager=True).cast(pl.String) + "-payload-text-xxxxxxxx",
        }
    )
    store.write(DatasetSpec(name="source", primary_key="id", strategy="replace"), frame)


def _case(pg_url: str, batch: int, name: str) -> dict[str, float]:
    import psycopg
    from pyiceberg.catalog.sql import SqlCatalog

    from pipeline_output import DatasetSpec, IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock
    from pipeline_output.infra.settings import to_sqlalchemy_url
    from pipeline_output.ledger.migrations import migrate
    from pipeline_output.ledger.window_ledger import WindowLedger
    from pipeline_output.services.model import ModelSpec, score
    from pipeline_output.services.publish import Publisher, ResolvedMode

    with psycopg.connect(pg_url) as conn:
        migrate(conn)
    catalog = SqlCatalog(
        "default", uri=to_sqlalchemy_url(pg_url, driver="psycopg"), warehouse=f"file://{WORK}/wh"
    )
    store = IcebergStore(catalog, "bench", lock=AdvisoryLock(pg_url))
    publisher = Publisher(iceberg=store, project_default="iceberg")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    model = ModelSpec(
        name=name,
        source=DatasetSpec(name="source", primary_key="id", strategy="replace"),
        predict=_predict,
        batch_rows=batch,
    )
    run = score(
        model,
        publisher=publisher,
        ledger=WindowLedger(pg_url),
        mode=ResolvedMode("iceberg", "project default"),
    )
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "seconds": elapsed,
        "peak_rss_mb": peak,
        "rss_before_mb": before,
        "rows": run.rows_scored,
        "batches": len(run.batches),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--child", choices=["setup", "case"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="scores", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "setup":
        _setup(args.url, args.rows)
        return
    if args.child == "case":
        print(json.dumps(_case(args.url, args.batch, args.name)))
        return

    from pipeline_output.infra import embedded_pg

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    url = embedded_pg.start(data_dir=WORK / "pg")
    try:
        me = [sys.executable, __file__, "--url", url, "--rows", str(args.rows)]
        subprocess.run([*me, "--child", "setup"], check=True)
        results = {}
        for label, batch in (("windowed", args.batch), ("whole", args.rows)):
            out = subprocess.run(
                [*me, "--child", "case", "--batch", str(batch), "--name", f"scores_{label}"],
                check=True,
                capture_output=True,
                text=True,
            )
            results[label] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"model node over {args.rows:,} source rows (python {sys.version.split()[0]})")
        print(
            f"{'case':<10} {'batch rows':>10} {'batches':>8} {'seconds':>8} {'peak RSS MB':>12} {'RSS before MB':>14}"
        )
        for label, batch in (("windowed", args.batch), ("whole", args.rows)):
            r = results[label]
            print(
                f"{label:<10} {batch:>10,} {int(r['batches']):>8} {r['seconds']:>8.2f} "
                f"{r['peak_rss_mb']:>12.0f} {r['rss_before_mb']:>14.0f}"
            )
        w, h = results["windowed"], results["whole"]
        print(
            f"peak RSS windowed / whole: {w['peak_rss_mb'] / h['peak_rss_mb']:.2f} "
            f"(scoring memory above the baseline: {w['peak_rss_mb'] - w['rss_before_mb']:.0f} MB vs "
            f"{h['peak_rss_mb'] - h['rss_before_mb']:.0f} MB)"
        )
    finally:
        embedded_pg.stop(data_dir=WORK / "pg")


if __name__ == "__main__":
    main()
