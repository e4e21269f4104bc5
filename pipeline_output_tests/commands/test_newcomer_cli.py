"""A newcomer's first hour (issue 32), as real `pipeline-output` processes run from the directory of
their own project (`user_project.py`: found through its `pyproject.toml`, never the demo).

One project and one database for the module: `journey` runs the commands in the order a newcomer
would — plan, materialize, status, a failing check with new source rows, the same with
`--verbose`, windows restate by seq number, flip to dual, parity, a dual materialisation — and
the tests below each check one promise on what it recorded.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pipeline_output_tests.commands import user_project as up
from pipeline_output_tests.commands.cli_runner import Run, isolated_env, runner
from pipeline_output_tests.oracle import assert_same_multiset

NEW_ROWS = 30  # source rows the newcomer adds before the second materialize


@dataclass
class Journey:
    """What the commands printed, and the state between them."""

    root: Path
    url: str
    home: Path
    out: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    region_snapshot: int | None = None  # region_totals' main after the first materialize


def columns(text: str) -> list[dict[str, str]]:
    """A plain-text table (header line first, columns two spaces apart) as rows of
    {column: value}; stops at the first blank or `runs:` line."""
    lines = text.splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    out = []
    for line in lines[1:]:
        if not line.strip() or line.startswith("runs:"):
            break
        values = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        out.append(dict(zip(names, values, strict=True)))
    return out


def summary(proc: subprocess.CompletedProcess[str]) -> dict[tuple[str, str], dict[str, str]]:
    """The materialise summary as {(dataset, arm): {column: value}}."""
    text = proc.stdout[proc.stdout.index("dataset ") :]
    return {(r["dataset"], r["arm"]): r for r in columns(text)}


def _main_snapshot(journey: Journey, dataset: str) -> int | None:
    with up.catalog(journey.home, journey.url) as cat:
        snapshot = cat.load_table(f"datasets.{dataset}").current_snapshot()
    return snapshot.snapshot_id if snapshot is not None else None


@pytest.fixture(scope="module")
def journey(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journey]:
    tmp = tmp_path_factory.mktemp("newcomer")
    with up.project_database(pg_url) as url:
        root = up.make_project(tmp / "orders-project", url)
        state = Journey(root=root, url=url, home=tmp / "home")
        cli: Run = runner(env=isolated_env(tmp, url), cwd=root)
        out = state.out
        out["plan"] = cli("plan")
        out["materialize"] = cli("materialize")
        state.region_snapshot = _main_snapshot(state, "region_totals")
        out["status"] = cli("status")
        # new source rows after the last window, and a refund that fails the blocking check
        later = [
            (i, r, a, c + timedelta(days=40), u + timedelta(days=40))
            for i, r, a, c, u in up.order_rows(NEW_ROWS, first=10_000)
        ]
        up.insert_orders(url, later)
        up.add_refund(url)
        out["failing"] = cli("materialize")
        out["verbose"] = cli("materialize", "--select", "region_totals", "--verbose")
        out["windows"] = cli("windows", "order_changes")
        out["restate"] = cli("windows", "restate", "order_changes", "2")
        out["restate_unknown"] = cli("windows", "restate", "order_changes", "(0, 1]")
        out["flip"] = cli("flip", "order_changes", "dual")
        out["parity_unwritten"] = cli("parity", "order_changes")
        up.ok(cli("flip", "orders", "dual"))
        out["dual"] = cli("materialize", "--select", "orders")
        out["parity_dual"] = cli("parity", "orders")
        yield state


def test_plan_lists_the_pending_windows_with_their_source_rows_and_the_effect_per_arm(
    journey: Journey,
) -> None:
    text = up.ok(journey.out["plan"])
    assert "order_changes: 4 pending windows, 350 source row(s) (4 not yet planned)" in text, text
    windows = [line for line in text.splitlines() if line.startswith("  new window")]
    assert [line.rsplit(": ", 1)[1] for line in windows] == [
        "100 source row(s) (not yet planned)"
    ] * 3 + ["50 source row(s) (not yet planned)"], text
    assert "order_changes [iceberg, mode iceberg from declared]: replace (first deploy)" in text, (
        text
    )
    assert "then 3 more window(s): upsert" in text
    assert "orders [pg, mode pg from project default]: replace (first deploy)" in text
    # plan records nothing: the first materialize plans the windows itself
    assert "4 windows" in journey.out["materialize"].stdout


def test_a_first_range_run_sums_its_windows_and_its_note_keeps_the_span(journey: Journey) -> None:
    text = up.ok(journey.out["materialize"])
    rows = summary(journey.out["materialize"])
    changes = rows[("order_changes", "iceberg")]
    figures = [changes[c] for c in ("in", "ins", "upd", "del")]
    assert figures == ["350", "350", "0", "0"], text  # the 4 windows summed
    end = up.order_rows()[-1][4].isoformat()
    assert changes["note"] == f"4 windows (-inf, {end}]: 4 applied", text
    assert {k[0] for k in rows} == {"order_changes", "orders", "region_totals", "order_scores"}
    assert all(r["result"] == "ok" for r in rows.values()), text


def test_each_window_partition_records_its_own_figures(journey: Journey) -> None:
    key = dg.AssetKey("order_changes")
    with up.instance(journey.home, journey.url) as inst:
        partitions = sorted(inst.get_dynamic_partitions("order_changes__windows"))[:4]
        figures = []
        for partition in partitions:
            records = inst.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
            ).records
            meta = up.meta(records[0].event_log_entry)
            figures.append(
                (
                    meta["window_action"],
                    meta["rows_in"],
                    meta["rows_inserted"],
                    meta["dagster/partition_row_count"],
                    meta["iceberg/snapshot_id"],
                )
            )
    assert [f[:4] for f in figures] == [
        ("applied", 100, 100, 100),
        ("applied", 100, 100, 100),
        ("applied", 100, 100, 100),
        ("applied", 50, 50, 50),
    ], figures
    assert len({f[4] for f in figures}) == 4, "each window records its own snapshot"


def test_sources_are_observed_every_sensor_tick(journey: Journey) -> None:
    with up.instance(journey.home, journey.url) as inst:
        records = inst.fetch_observations(dg.AssetKey("orders_raw"), limit=10).records
    assert len(records) >= 2, "each materialize evaluates the sensor once: one observation each"
    meta = up.meta(records[0].event_log_entry)
    assert meta["watermark"] == "updated_at"
    assert meta["dagster/row_count"] == up.ORDER_COUNT + NEW_ROWS + 1
    assert meta["high_water_mark"].startswith("2026-12-")


def test_status_says_a_mode_declared_on_the_dataset_is_declared(journey: Journey) -> None:
    rows = {r["dataset"]: r for r in columns(up.ok(journey.out["status"]))}
    assert (rows["region_totals"]["mode"], rows["region_totals"]["from"]) == (
        "iceberg",
        "declared",
    )
    assert (rows["orders"]["mode"], rows["orders"]["from"]) == ("pg", "project default")


def test_a_failing_check_is_one_error_line_and_stops_only_what_depends_on_it(
    journey: Journey,
) -> None:
    proc = journey.out["failing"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "DEBUG" not in proc.stdout + proc.stderr
    rows = summary(proc)
    assert {k[0] for k in rows} == {"order_changes", "orders", "region_totals", "order_scores"}
    region = rows[("region_totals", "iceberg")]
    assert region["result"] == "failed" and "main unchanged" in region["note"], region
    assert rows[("order_scores", "pg")]["result"] == "ok", proc.stdout  # independent of it
    assert rows[("orders", "pg")]["result"] == "ok", proc.stdout
    changes = rows[("order_changes", "iceberg")]
    assert (changes["in"], changes["result"]) == (str(NEW_ROWS + 1), "ok"), changes  # new window
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, proc.stderr
    [error] = errors
    assert error.startswith("error: region_totals: check 'revenue_not_negative' failed"), error
    assert "main unchanged" in error and "branch audit-" in error and " kept " in error, error
    assert _main_snapshot(journey, "region_totals") == journey.region_snapshot, "main moved"
    [log] = [line for line in proc.stderr.splitlines() if line.startswith("full log: ")]
    text = Path(log.removeprefix("full log: ")).read_text()
    assert "DagsterAssetCheckFailedError" in text and "STEP_FAILURE" in text
    assert len(proc.stderr.splitlines()) == 2, proc.stderr  # the error and the log's path


def test_verbose_shows_dagsters_log_and_the_traceback(journey: Journey) -> None:
    proc = journey.out["verbose"]
    assert proc.returncode == 1
    assert "DEBUG" in proc.stderr and "DagsterAssetCheckFailedError" in proc.stderr
    assert "error: region_totals: check 'revenue_not_negative' failed" in proc.stderr


def test_parity_right_after_a_flip_to_dual_is_one_line_and_exit_1(journey: Journey) -> None:
    flipped = up.ok(journey.out["flip"])
    assert flipped.startswith("order_changes: iceberg (declared) -> dual by "), flipped
    proc = journey.out["parity_unwritten"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr
    [line] = proc.stdout.splitlines()
    assert line.endswith(
        "the legacy (pg) arm holds no rows of order_changes yet: materialize it in dual mode first"
    ), line
    assert "parity PASS" in up.ok(journey.out["parity_dual"])


def test_a_dual_materialisation_shows_both_arms(journey: Journey) -> None:
    up.ok(journey.out["dual"])
    rows = summary(journey.out["dual"])
    ice, pg = rows[("orders", "iceberg")], rows[("orders", "pg")]
    total = str(up.ORDER_COUNT + NEW_ROWS + 1)
    # the Iceberg arm's first deploy replaces everything; the legacy arm upserts the same rows
    assert (ice["write mode"], ice["in"], ice["ins"]) == ("replace", total, total), ice
    assert (pg["write mode"], pg["in"], pg["ins"], pg["upd"]) == ("upsert", total, "0", "0"), pg
    assert ice["mode"] == pg["mode"] == "dual (from flip)"
    assert ice["snapshot"] != pg["snapshot"]


def test_restate_takes_the_seq_number_the_listing_shows_and_is_quiet(journey: Journey) -> None:
    listed = up.ok(journey.out["windows"]).splitlines()
    second = next(line.split() for line in listed if line.split()[0] == "2")
    window = f"{second[1]} {second[2]}"  # `(low, high]`
    proc = journey.out["restate"]
    text = up.ok(proc)
    assert "DEBUG" not in text + proc.stderr and "Traceback" not in proc.stderr
    assert f"order_changes: window 2 {window} restated" in text, text
    rows = summary(proc)
    assert rows[("order_changes", "iceberg")]["write mode"] == "replace", text
    bad = journey.out["restate_unknown"]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "give its seq number as `pipeline-output windows order_changes` lists it" in bad.stderr


def test_the_delta_table_holds_what_polars_computes_from_the_source(journey: Journey) -> None:
    import psycopg

    with psycopg.connect(journey.url) as conn:
        source = pl.DataFrame(
            conn.execute("SELECT order_id, region, amount FROM public.orders").fetchall(),
            schema=["order_id", "region", "amount"],
            orient="row",
        )
    with up.catalog(journey.home, journey.url) as cat:
        changes = pl.from_arrow(cat.load_table("datasets.order_changes").scan().to_arrow())
    assert isinstance(changes, pl.DataFrame)
    assert_same_multiset(changes.select("order_id", "region", "amount"), source)
