"""A location's runs as `dg launch` and the daemon launch them (issue 42, item 9): with the job's
own executor on a persistent instance — not `execute_in_process`, which runs in process whatever
the location says. Every step runs in the run worker unless the location names an executor, and a
dataset's checks (`parity`, `table_health`) run in the dataset's own step: a run of one partition
is one step, and each check reports from it.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.definitions.reconstruct import ReconstructableRepository

from pipeline_output import PipelineOutputComponent, build_definitions, dataset
from pipeline_output.dagster_layer.run_report import write_log
from pipeline_output.dagster_layer.runner import materialize
from pipeline_output_tests.dagster_runs import check_evals, mat_meta, run_assets
from pipeline_output_tests.publishers import corrupt_pg_row

DAYS = dg.DailyPartitionsDefinition(start_date="2026-03-01", end_date="2026-03-04")
DAY = "2026-03-02"


@dataset(primary_key="id", mode="dual", partitions_def=DAYS, partition_column="day")
def daily_sales(partition_key: str) -> pl.DataFrame:
    """Two sales a day, both arms."""
    day = date.fromisoformat(partition_key)
    first = day.toordinal() * 10
    return pl.DataFrame(
        {
            "id": pl.Series([first, first + 1], dtype=pl.Int64),
            "day": pl.Series([day, day], dtype=pl.Date),
            "amount": pl.Series([1.5, 2.5], dtype=pl.Float64),
        }
    )


def location(**options: object) -> dg.Definitions:
    return build_definitions(datasets=[daily_sales], **options)  # type: ignore[arg-type]


@dg.definitions
def code_location() -> dg.Definitions:
    """The code location `launched` loads, as `dg launch` loads a project's."""
    return location()


def launched(instance: dg.DagsterInstance, partition: str) -> str:
    """Run one partition of `daily_sales` as `dg launch --assets daily_sales --partition ...`
    does (`dagster asset materialize`): the location's implicit asset job, reconstructable from
    the code location, executed with its own executor. The run's id."""
    repository = ReconstructableRepository.for_module(__name__, "code_location")
    job = repository.get_definition().get_implicit_job_def_for_assets([daily_sales.key])
    assert job is not None
    with dg.execute_job(
        repository.get_reconstructable_job(job.name),
        instance,
        asset_selection=[daily_sales.key],
        tags=job.get_tags_for_partition_key(partition, selected_asset_keys=[daily_sales.key]),
    ) as result:
        assert result.success
        return result.run_id


def executor_of(defs: dg.Definitions) -> dg.ExecutorDefinition:
    return defs.resolve_implicit_global_asset_job_def().executor_def


def test_the_location_runs_in_process_unless_it_names_an_executor() -> None:
    assert executor_of(location()) is dg.in_process_executor
    assert executor_of(location(executor=dg.multiprocess_executor)) is dg.multiprocess_executor
    assert location().resolve_job_def("table_health").executor_def is dg.in_process_executor

    def component(**attributes: object) -> dg.Definitions:
        resolved = PipelineOutputComponent.resolve_from_dict({"module": __name__, **attributes})
        return dg.component_defs(component=resolved)

    assert executor_of(component()) is dg.in_process_executor
    assert executor_of(component(executor="multiprocess")) is dg.multiprocess_executor


def test_a_run_of_one_partition_is_one_step_that_writes_and_checks_the_dataset(
    env: str, tmp_path: Path
) -> None:
    home = tmp_path / "dagster_home"  # a persistent instance, as `$DAGSTER_HOME` gives `dg launch`
    home.mkdir()
    with dg.DagsterInstance.local_temp(str(home)) as instance:
        run_id = launched(instance, DAY)
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.execution_plan_snapshot_id is not None
        plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        assert [step.key for step in plan.steps] == ["daily_sales"]

        events = [e for e in instance.all_logs(run_id) if e.dagster_event is not None]
        kinds = dg.DagsterEventType
        started = [e.step_key for e in events if e.dagster_event_type == kinds.STEP_START]
        assert started == ["daily_sales"]
        engine = [e.message for e in events if e.dagster_event_type == kinds.ENGINE_EVENT]
        assert any("in process" in m for m in engine), engine
        evaluations = {
            e.dagster_event.event_specific_data.check_name: e  # type: ignore[union-attr]
            for e in events
            if e.dagster_event_type == kinds.ASSET_CHECK_EVALUATION
        }
        assert set(evaluations) == {"parity", "table_health"}
        assert {e.step_key for e in evaluations.values()} == {"daily_sales"}
        parity = evaluations["parity"].dagster_event.event_specific_data  # type: ignore[union-attr]
        assert parity.passed and "parity PASS" in (parity.description or ""), parity
        materialised = [
            e.dagster_event.partition  # type: ignore[union-attr]
            for e in events
            if e.dagster_event_type == kinds.ASSET_MATERIALIZATION
        ]
        assert materialised == [DAY]


ROWS: dict[str, pl.DataFrame] = {}


@dataset(primary_key="id", strategy="snapshot_replace", mode="dual")
def flat() -> pl.DataFrame:
    return ROWS["flat"]


@dataset(primary_key="id", mode="iceberg")
def after(flat: pl.LazyFrame) -> pl.LazyFrame:
    return flat


def test_a_failed_blocking_parity_in_the_datasets_step_reads_as_before(env: str) -> None:
    """The check fails the dataset's step now, not a step of its own: the summary still says the
    dataset was written and names the failed check once; the asset downstream does not run."""
    defs = build_definitions(datasets=[flat, after])
    ids = pl.Series(list(range(1, 6)), dtype=pl.Int64)
    ROWS["flat"] = pl.DataFrame({"id": ids, "amount": ids.cast(pl.Float64)})
    with dg.DagsterInstance.ephemeral() as instance:
        assert materialize(defs, instance).ok
        # 3 is not in the next compute: snapshot_replace keeps it as each arm holds it
        corrupt_pg_row(env, "flat", "3", "amount", 99.0)
        ids = pl.Series([4, 5, 6], dtype=pl.Int64)
        ROWS["flat"] = pl.DataFrame({"id": ids, "amount": ids.cast(pl.Float64)})
        report = materialize(defs, instance)
    [failure] = report.failures
    assert failure.asset == "flat" and "check 'parity' failed" in failure.message, failure
    assert "only in pg" in failure.message or "parity FAIL" in failure.message, failure
    status = {row.asset: row.status for row in report.rows}
    assert status == {"flat": "ok", "after": "not run"}, report.rows


def test_parity_in_the_datasets_step_knows_the_arms_its_write_wrote_without_the_instance(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's own write tells `parity` which arms it wrote: no query of the instance for the
    latest materialisation. A dual write is still compared (and a diverged one fails, the
    downstream not run); a single-arm write is still skipped (no evaluation)."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("parity asked the instance for the latest materialisation")

    monkeypatch.setattr(dg.DagsterInstance, "get_latest_materialization_event", refused)
    defs = build_definitions(datasets=[flat, after], with_maintenance=False)
    ids = pl.Series([1, 2, 3], dtype=pl.Int64)
    ROWS["flat"] = pl.DataFrame({"id": ids, "amount": ids.cast(pl.Float64)})
    with dg.DagsterInstance.ephemeral() as instance:
        first = run_assets(defs, instance, ["flat", "after"])
        evals = check_evals(first)
        assert set(evals) == {"flat"} and evals["flat"].passed, evals  # `after`: skipped
        corrupt_pg_row(env, "flat", "3", "amount", 99.0)
        ids = pl.Series([4, 5], dtype=pl.Int64)  # snapshot_replace keeps 3 as each arm holds it
        ROWS["flat"] = pl.DataFrame({"id": ids, "amount": ids.cast(pl.Float64)})
        second = run_assets(defs, instance, ["flat", "after"], raise_on_error=False)
    evals = check_evals(second)
    assert not second.success and set(evals) == {"flat"}, evals
    assert not evals["flat"].passed and "parity FAIL" in (evals["flat"].description or "")
    assert not second.asset_materializations_for_node("after")


@dataset(
    name="daily_ice", primary_key="id", mode="iceberg", partitions_def=DAYS, partition_column="day"
)
def daily_ice(partition_key: str) -> pl.DataFrame:
    """Two sales a day, the Iceberg arm only."""
    day = date.fromisoformat(partition_key)
    return pl.DataFrame(
        {"id": [day.toordinal() * 10, day.toordinal() * 10 + 1], "day": [day, day]},
        schema={"id": pl.Int64, "day": pl.Date},
    )


def _lines(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The run's log lines (`context.log`'s and Dagster's own, not its events)."""
    return [
        entry.user_message for entry in instance.all_logs(run_id) if entry.dagster_event is None
    ]


def test_a_write_logs_no_line_its_materialisation_says_what_it_did_and_why_parity_skipped(
    env: str,
) -> None:
    """Each log line is an event written to the run's storage (issue 44): a write's own line
    repeated its materialisation, so there is none — the materialisation says what the write did
    and, for a write of one arm, that `parity` has nothing to compare (`parity`); neither the
    check nor Dagster adds a line for the check's missing result. The check is still planned and
    reports no result (Dagster shows it skipped); a dual write's parity compares."""
    ids = pl.Series([1, 2, 3], dtype=pl.Int64)
    ROWS["flat"] = pl.DataFrame({"id": ids, "amount": ids.cast(pl.Float64)})
    whole = build_definitions(datasets=[flat, after], with_maintenance=False)
    parted = build_definitions(datasets=[daily_ice], with_maintenance=False)
    with dg.DagsterInstance.ephemeral() as instance:
        first = run_assets(whole, instance, ["flat", "after"])
        day = parted.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("daily_ice")], partition_key=DAY
        )
        assert day.success
        lines = _lines(instance, first.run_id) + _lines(instance, day.run_id)
        planned = [
            e.dagster_event.event_specific_data.check_name  # type: ignore[union-attr]
            for e in instance.all_logs(day.run_id)
            if e.dagster_event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED
        ]
    assert lines == [], lines  # main: the writes' lines and Dagster's "did not yield" ones
    skipped = "parity skipped: not a dual write (arms: iceberg); nothing to compare"
    after_meta, day_meta = mat_meta(first, "after"), mat_meta(day, "daily_ice")
    assert after_meta["parity"] == skipped and day_meta["parity"] == skipped
    assert after_meta["write_mode"] and after_meta["rows_inserted"] == 3, after_meta
    assert day_meta["partitions"].startswith(f"{DAY}: +2 ~0 -0 (replace, commit "), day_meta
    assert "parity" not in mat_meta(first, "flat")
    assert set(check_evals(first)) == {"flat"} and check_evals(first)["flat"].passed
    assert planned == ["parity"] and not check_evals(day)


def test_the_run_log_file_says_under_each_materialisation_what_the_write_did(
    env: str, tmp_path: Path
) -> None:
    """A write logs no line of its own (above), so the run's log file — the CLI's `full log:` —
    says what each write did under its materialisation: partition, mode, write mode and why,
    row counts, commit, and why parity was skipped; long per-partition text stays in the UI."""
    ids = pl.Series([1, 2, 3], dtype=pl.Int64)
    ROWS["flat"] = pl.DataFrame({"id": ids, "amount": ids.cast(pl.Float64)})
    whole = build_definitions(datasets=[flat, after], with_maintenance=False)
    parted = build_definitions(datasets=[daily_ice], with_maintenance=False)
    log = tmp_path / "runs.log"
    with dg.DagsterInstance.ephemeral() as instance:
        first = run_assets(whole, instance, ["flat", "after"])
        day = parted.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("daily_ice")], partition_key=DAY
        )
        write_log(log, instance, first.run_id)
        write_log(log, instance, day.run_id)
    text = log.read_text()
    facts = [
        line.strip()
        for previous, line in zip(text.splitlines(), text.splitlines()[1:], strict=False)
        if " ASSET_MATERIALIZATION: " in previous
    ]
    assert len(facts) == 3, text  # flat (both arms in one materialisation), after, the day
    after_line = next(f for f in facts if "arms=iceberg" in f.split("; "))
    snapshot = mat_meta(first, "after")["iceberg/snapshot_id"]
    for fact in (
        f"write_mode={mat_meta(first, 'after')['write_mode']}",
        "rows_inserted=3",
        f"iceberg/snapshot_id={snapshot}",
    ):
        assert fact in after_line.split("; "), (fact, after_line)
    skipped = '"parity skipped: not a dual write (arms: iceberg); nothing to compare"'
    assert after_line.endswith(f"; parity={skipped}"), after_line  # quoted: it holds "; "
    [day_line] = [f for f in facts if f.startswith(f"partition={DAY}; ")]
    assert "rows_inserted=2" in day_line.split("; "), day_line
    assert "dagster/column_schema" not in text


def test_the_summary_of_a_range_run_gives_each_arm_its_mode_and_the_rows_of_every_partition(
    env: str,
) -> None:
    """A range run says its mode and arms once, on its last partition's materialisation (each
    partition carries only its own write's figures): the CLI's summary still has one row per
    arm, with the run's mode and the rows of all its partitions summed."""
    from pipeline_output.dagster_layer.run_report import collect, format_table

    defs = location(with_maintenance=False)
    days = DAYS.get_partition_keys()
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance,
            asset_selection=[daily_sales.key],
            tags={
                "dagster/asset_partition_range_start": days[0],
                "dagster/asset_partition_range_end": days[-1],
            },
        )
        assert result.success
        outcome = collect(result, defs, [daily_sales.key])
    metas = [dict(m.metadata) for m in result.asset_materializations_for_node("daily_sales")]
    assert len(metas) == len(days) and "arms" not in metas[0] and "arms" in metas[-1]
    assert outcome.ok, outcome.failures
    table = format_table(outcome.rows)
    assert sorted(r.arm for r in outcome.rows) == ["iceberg", "pg"], table
    for row in outcome.rows:
        assert row.mode.startswith("dual"), table
        assert row.rows_in == 2 * len(days) and row.rows_inserted == 2 * len(days), table
