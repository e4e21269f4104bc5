"""`pipeline-output flip|status|parity|drain` as real processes (the installed console script) on a
fresh test database: each command is a new process, so everything it shows came from Postgres.
"""

from __future__ import annotations

import getpass
import json
from typing import Any

import polars as pl
import psycopg
import pytest

from pipeline_output.ledger import Ledger

DEMO = ["active_products", "customer_churn", "customers", "daily_revenue", "order_events", "orders"]


def products(ids: range, version: int = 0) -> pl.DataFrame:
    ids_ = list(ids)
    return pl.DataFrame(
        {
            "product_id": pl.Series(ids_, dtype=pl.Int64),
            "name": [f"p{i}-v{version}" for i in ids_],
            "price": [i * 1.25 for i in ids_],
        }
    )


def demo_spec(name: str) -> Any:
    from pipeline_output.commands.loading import dataset_specs

    return dataset_specs()[name]


def write_dual(runtime: Any, name: str, frame: pl.DataFrame) -> None:
    from pipeline_output.services.publish import ResolvedMode

    runtime.publisher.publish(demo_spec(name), frame, mode=ResolvedMode("dual", "run config"))


def error_line(result: Any) -> str:
    """Exit 2 with exactly one `error: ...` line and no traceback; returns that line."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_flip_records_who_when_from_to_and_a_new_process_sees_the_history(cli, pg_db_url):
    first = cli("flip", "customers", "dual", "--who", "alice", "--reason", "canary")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("customers: (default) -> dual by alice at "), first.stdout
    second = cli("flip", "customers", "iceberg")
    assert second.returncode == 0, second.stderr
    assert f"customers: dual -> iceberg by {getpass.getuser()} at " in second.stdout

    history = Ledger(pg_db_url).flip_log.flip_history(
        "customers"
    )  # a third "process": a new ledger
    assert [(h.from_mode, h.to_mode, h.who, h.reason) for h in history] == [
        (None, "dual", "alice", "canary"),
        ("dual", "iceberg", getpass.getuser(), None),
    ]
    assert history[0].at <= history[1].at


def test_flip_to_an_unknown_mode_or_dataset_exits_2_with_one_line_listing_the_valid_ones(
    cli, pg_db_url
):
    bad_mode = cli("flip", "customers", "parquet")
    line = error_line(bad_mode)
    assert all(m in line for m in ("pg", "iceberg", "dual")), line
    bad_dataset = cli("flip", "nope", "dual")
    line = error_line(bad_dataset)
    assert all(d in line for d in DEMO), line
    ledger = Ledger(pg_db_url)
    ledger.migrate()  # the refused flips connected to nothing: not even the migrations ran
    assert ledger.flip_log.flips() == {}
    # "one line": nothing else on stderr (e.g. warnings printed while loading definitions)
    for result in (bad_mode, bad_dataset):
        assert result.stderr.strip().splitlines() == [error_line(result)], result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["parity", "drain"])
def test_parity_and_drain_of_an_unknown_dataset_exit_2_listing_the_datasets(cli, command):
    line = error_line(cli(command, "nope"))
    assert all(d in line for d in DEMO), line


def test_parity_command_passes_then_exits_1_naming_a_corrupted_key(cli, runtime, pg_db_url):
    write_dual(runtime, "active_products", products(range(1, 31)))
    ok = cli("parity", "active_products")
    assert ok.returncode == 0, (ok.stdout, ok.stderr)
    assert "active_products: parity PASS (pg 30 rows, iceberg 30 rows)" in ok.stdout

    with psycopg.connect(pg_db_url) as conn:
        conn.execute(
            "UPDATE pipeline_output.dataset_rows SET data = jsonb_set(data, '{price}', %s::jsonb) "
            "WHERE dataset_id = 'active_products' AND pk = '23'",
            (json.dumps(999.5),),
        )
    bad = cli("parity", "active_products")
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    assert "parity FAIL" in bad.stdout
    assert "only in pg: [23]" in bad.stdout and "only in iceberg: [23]" in bad.stdout
    last = Ledger(pg_db_url).parity_log.last_parity("active_products")
    assert last is not None and not last.passed


def test_drain_command_refuses_clearly_then_drains_after_flip_and_parity(cli, runtime, pg_db_url):
    from pipeline_output.services.canary import check_parity

    write_dual(runtime, "active_products", products(range(1, 11)))
    runtime.ledger.flip_log.flip("active_products", "dual", who="t")
    assert check_parity(runtime.publisher, demo_spec("active_products")).passed
    refused = error_line(cli("drain", "active_products"))
    assert "drain refused" in refused and "flip it to iceberg" in refused, refused

    runtime.ledger.flip_log.flip("active_products", "iceberg", who="t")
    with psycopg.connect(pg_db_url) as conn:  # the last parity now fails
        conn.execute(
            "UPDATE pipeline_output.dataset_rows SET data = jsonb_set(data, '{name}', '\"x\"') "
            "WHERE dataset_id = 'active_products' AND pk = '4'"
        )
    assert not check_parity(runtime.publisher, demo_spec("active_products")).passed
    failed = error_line(cli("drain", "active_products"))
    assert "drain refused" in failed and "failed" in failed, failed
    assert runtime.postgres.count("active_products") == 10

    write_dual(runtime, "active_products", products(range(1, 11)))  # repairs row 4 (sync)
    assert check_parity(runtime.publisher, demo_spec("active_products")).passed
    drained = cli("drain", "active_products")
    assert drained.returncode == 0, drained.stderr
    assert "drained 10 legacy row(s)" in drained.stdout
    assert runtime.postgres.count("active_products") == 0

    # the native arm keeps working as a re-deploy after the drain
    from pipeline_output.services.publish import ResolvedMode

    out = runtime.publisher.publish(
        demo_spec("active_products"),
        products(range(1, 13), version=1),
        mode=ResolvedMode("iceberg", "flip"),
    )
    assert (out.results["iceberg"].first_deploy, out.results["iceberg"].write_mode) == (
        False,
        "sync",
    )


def test_status_lists_every_dataset_with_mode_source_deploys_rows_and_parity(
    cli, runtime, pg_db_url
):
    from pipeline_output.services.canary import check_parity

    write_dual(runtime, "active_products", products(range(1, 8)))
    runtime.ledger.flip_log.flip("active_products", "dual", who="t")
    assert check_parity(runtime.publisher, demo_spec("active_products")).passed
    board = cli("status")
    assert board.returncode == 0, board.stderr
    lines = board.stdout.strip().splitlines()
    header = lines[0]
    for column in ("dataset", "mode", "from", "last pg deploy", "last iceberg deploy", "parity"):
        assert column in header, header
    assert "pg rows" in header and "iceberg rows" in header
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert sorted(by_name) == DEMO
    ap = by_name["active_products"]
    assert ap.split()[1:3] == ["dual", "flip"], ap
    assert ap.count("succeeded replace") == 2, ap  # last deploy per arm
    assert " 7 " in ap and "PASS" in ap, ap
    untouched = by_name["orders"]
    assert untouched.split()[1:4] == ["iceberg", "dataset", "default"], untouched
    assert untouched.split()[-1] == "-", untouched  # no parity yet
