"""`pipeline-output maintain` (and what `status` shows after it) as real processes on a fresh test
database: the demo code location, one of its datasets fed many small files through the store."""

from __future__ import annotations

import polars as pl

from pipeline_output_tests.oracle import assert_same_multiset


def _row(stdout: str, dataset: str) -> list[str]:
    """The before/after table's row of `dataset`, split on two or more spaces."""
    import re

    line = next(x for x in stdout.splitlines() if x.startswith(dataset + " "))
    return re.split(r"\s{2,}", line.strip())


def test_maintain_dry_run_then_compact_then_expire_with_a_before_after_table(cli, runtime):
    from pipeline_output.commands.loading import dataset_specs

    spec = dataset_specs()["customers"]
    written = []
    for n in range(8):  # eight small upserts of new keys: eight files, eight snapshots
        rows = pl.DataFrame({"customer_id": list(range(n * 10, n * 10 + 10)), "n": [n] * 10})
        runtime.iceberg.write(spec, rows)
        written.append(rows)

    dry = cli("maintain", "customers", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert _row(dry.stdout, "customers")[1:] == [
        "8 -> (dry run)",
        "0 -> (dry run)",
        "8 -> (dry run)",
        _row(dry.stdout, "customers")[4],
    ]
    assert "customers: compact: would rewrite 8 data file(s) into 1 bin(s)" in dry.stdout
    assert "customers: audits: would drop 0 stale audit branch(es)" in dry.stdout
    assert "maintenance (dry run)" in dry.stderr  # the progress bar's label, on stderr
    assert len(runtime.iceberg.load(spec).snapshots()) == 8  # nothing changed

    compacted = cli("maintain", "customers", "--compact")
    assert compacted.returncode == 0, compacted.stderr
    assert _row(compacted.stdout, "customers")[1:4] == ["8 -> 1", "0 -> 0", "8 -> 9"]
    assert "expire:" not in compacted.stdout and "audits:" not in compacted.stdout  # only it

    expired = cli("maintain", "customers", "--expire", "0s", "--orphans", "--grace", "0")
    assert expired.returncode == 0, expired.stderr
    assert _row(expired.stdout, "customers")[1:4] == ["1 -> 1", "0 -> 0", "9 -> 1"]
    assert "customers: expire: expired 8 of 9 snapshot(s)" in expired.stdout
    assert "customers: orphans: removed 0 file(s)" in expired.stdout
    assert_same_multiset(runtime.iceberg.read(spec), pl.concat(written))

    board = cli("status")
    assert board.returncode == 0, board.stderr
    header, *lines = board.stdout.strip().splitlines()
    assert "iceberg files (data/delete)" in header and "last maintenance" in header
    customers = next(x for x in lines if x.startswith("customers "))
    assert " 1/0 " in customers and " UTC " in customers, customers


def test_maintain_skips_datasets_without_a_table_and_refuses_unknown_names_and_ages(cli):
    everything = cli("maintain", "--dry-run")
    assert everything.returncode == 0, everything.stderr
    assert "orders: skipped (no Iceberg table)" in everything.stdout
    unknown = cli("maintain", "nope")
    assert unknown.returncode == 2 and "unknown dataset 'nope'" in unknown.stderr
    bad_age = cli("maintain", "orders", "--expire", "soon")
    assert bad_age.returncode == 2 and "--expire 'soon'" in bad_age.stderr
    bad_retention = cli("maintain", "orders", "--audits", "later")
    assert bad_retention.returncode == 2 and "--audits 'later'" in bad_retention.stderr
