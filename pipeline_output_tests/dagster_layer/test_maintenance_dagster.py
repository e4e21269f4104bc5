"""Acceptance: table maintenance as Dagster-native work, on a real Dagster instance.

A dataset materialised through Dagster, then fed many small files (window-sized writes through
the store), warns in its `table_health` check; the `table_maintenance` job compacts it and
expires its snapshots (recorded as an asset observation with the values before and after); the
check then passes, the rows are unchanged (oracle), and the next materialisation's metadata shows
the file counts and the last maintenance. `build_definitions` wires the job, the health job and a
schedule that is stopped unless turned on.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl
import psycopg

from pipeline_output import Delta, build_definitions, dataset, postgres_source
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.stores.iceberg.maintenance.compaction import LAST_COMPACTION
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds
from pipeline_output_tests.oracle import assert_same_multiset

SEED = pl.DataFrame({"id": list(range(1, 11)), "v": [f"v{i}" for i in range(1, 11)]})


@dataset(primary_key="id", strategy="snapshot_replace", mode="iceberg")
def ledgerless() -> pl.DataFrame:
    """The first 10 rows (later rows arrive through window-sized writes)."""
    return SEED


def _defs(**options: Any) -> dg.Definitions:
    return build_definitions(
        datasets=[ledgerless], health_thresholds=HealthThresholds(max_small_files=8), **options
    )


def _health(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    result = defs.resolve_job_def("table_health").execute_in_process(instance=instance)
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "table_health"
    return evaluation


def _meta(event: Any) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in event.metadata.items()}


def test_maintenance_job_compacts_and_the_health_check_warns_then_passes(env, instance):
    defs = _defs()
    materialised = dg.materialize([ledgerless], instance=instance, resources=defs.resources)
    assert materialised.success
    (first,) = materialised.get_asset_materialization_events()
    meta = _meta(first.materialization)
    assert (
        meta["iceberg/data_files"],
        meta["iceberg/delete_files"],
        meta["iceberg/last_maintenance"],
    ) == (1, 0, "never")
    assert _health(defs, instance).passed  # one file: healthy

    spec = spec_of(ledgerless)
    assert spec is not None
    written = [SEED]
    for w in range(1, 21):  # 20 small upserts: 21 small files
        rows = pl.DataFrame({"id": [w * 100 + i for i in range(5)], "v": [f"w{w}"] * 5})
        get_runtime().iceberg.write(spec, rows)  # new keys: a file of their own
        written.append(rows)
    warned = _health(defs, instance)
    assert not warned.passed and warned.severity == dg.AssetCheckSeverity.WARN
    assert "21 small data files" in (warned.description or "")
    assert _meta(warned)["data_files"] == 21

    run = defs.get_job_def("table_maintenance").execute_in_process(
        instance=instance,
        run_config={"ops": {"maintain_tables": {"config": {"older_than_hours": 0}}}},
    )

    assert run.success
    (reported,) = run.get_asset_check_evaluations()  # the job reports the check after its work
    assert reported.check_name == "table_health" and reported.passed
    observed = instance.fetch_observations(dg.AssetKey("ledgerless"), limit=1).records
    obs = _meta(observed[0].asset_observation)
    assert (obs["data_files_before"], obs["data_files"]) == (21, 1)
    assert (obs["snapshots_before"], obs["snapshots"]) == (21, 1)  # compacted, then expired
    assert "rewrote 21 data file(s) into 1 file(s)" in obs["maintenance"]
    assert _health(defs, instance).passed
    assert_same_multiset(get_runtime().iceberg.read(spec), pl.concat(written))

    again = dg.materialize([ledgerless], instance=instance, resources=defs.resources)
    meta = _meta(again.get_asset_materialization_events()[0].materialization)
    assert meta["iceberg/data_files"] == 1 and meta["iceberg/last_maintenance"] != "never"


def test_build_definitions_wires_a_stopped_schedule_unless_turned_on(env):
    defs = _defs()
    schedule = defs.get_schedule_def("table_maintenance_schedule")
    assert schedule.cron_schedule == "0 3 * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.job_name == "table_maintenance"
    on = _defs(maintenance_schedule_cron="15 * * * *", maintenance_schedule_running=True)
    hourly = on.get_schedule_def("table_maintenance_schedule")
    assert hourly.cron_schedule == "15 * * * *"
    assert hourly.default_status == dg.DefaultScheduleStatus.RUNNING
    bare = build_definitions(datasets=[ledgerless], with_maintenance=False)
    assert not list(bare.schedules or [])
    assert "table_maintenance" not in {j.name for j in bare.jobs or []}


def test_the_demo_location_has_the_maintenance_job_and_a_stopped_schedule():
    from pipeline_output.definitions import defs

    assert defs.get_job_def("table_maintenance") is not None
    schedule = defs.get_schedule_def("table_maintenance_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    checks = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert {"parity", "table_health"} <= checks


def test_a_maintenance_run_naming_an_unknown_dataset_fails_saying_so(env, instance):
    result = (
        _defs()
        .get_job_def("table_maintenance")
        .execute_in_process(
            instance=instance,
            run_config={"ops": {"maintain_tables": {"config": {"datasets": ["nope"]}}}},
            raise_on_error=False,
        )
    )
    assert not result.success
    failure = result.failure_data_for_node("maintain_tables")
    assert failure is not None and "unknown dataset(s) nope" in str(failure.error)


def test_window_runs_run_the_parity_check_but_leave_table_health_out(env, instance, pg_db_url):
    """Window runs are the high-frequency path: `table_health` reads every manifest; the sensor's
    run requests name the dataset's other checks only."""
    with psycopg.connect(pg_db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ev (id bigint PRIMARY KEY, v text, seq bigint)")
        conn.execute("INSERT INTO ev VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
    raw = postgres_source("ev", table="ev", watermark="seq")

    @dataset(strategy="append_always", mode="iceberg", delta=Delta(source="ev", watermark="seq"))
    def ev_copy(ev: pl.LazyFrame) -> pl.LazyFrame:
        return ev.select("id", "v", "seq")

    defs = build_definitions(datasets=[ev_copy], sources=[raw])
    sensor = defs.get_sensor_def("ev_copy__window_sensor")
    result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    assert isinstance(result, dg.SensorResult)
    (request,) = result.run_requests or []
    parity = dg.AssetCheckKey(dg.AssetKey("ev_copy"), "parity")
    assert request.asset_check_keys == [parity]

    # what the daemon launches for that request: the asset and exactly those checks
    for add in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(add.partitions_def_name, list(add.partition_keys))
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(request.asset_selection or []),
        asset_check_selection=set(request.asset_check_keys or []),
    )
    run = job.execute_in_process(instance=instance, partition_key=request.partition_key)
    assert run.success
    # parity was planned and ran in the dataset's step, but compared nothing on an Iceberg-only
    # write: no evaluation, which Dagster records as skipped; table_health was not planned
    steps = {e.step_key for e in run.all_events if e.event_type_value == "STEP_SUCCESS"}
    assert steps == {"ev_copy"}, steps
    records = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED
    ).records
    planned = [r.event_log_entry.dagster_event.event_specific_data.check_name for r in records]
    assert planned == ["parity"], planned
    assert run.get_asset_check_evaluations() == []
    assert get_runtime().iceberg.read(spec_of(ev_copy)).height == 3


def test_maintenance_drops_stale_audit_branches_so_they_no_longer_hold_compaction_off(
    env, instance
):
    from pipeline_output.services.publish import ResolvedMode

    defs = _defs()
    assert dg.materialize([ledgerless], instance=instance, resources=defs.resources).success
    spec = spec_of(ledgerless)
    assert spec is not None
    runtime = get_runtime()
    written = [SEED]
    for w in range(1, 9):
        rows = pl.DataFrame({"id": [w * 100 + i for i in range(5)], "v": [f"w{w}"] * 5})
        runtime.iceberg.write(spec, rows)
        written.append(rows)
    staged = pl.DataFrame({"id": [999], "v": ["never published"]})
    runtime.publisher.publish(
        spec, staged, mode=ResolvedMode("iceberg", "run config"), run_id="abandoned", audit=True
    )
    assert "audit-abandoned" in runtime.iceberg.load(spec).metadata.refs

    def maintain(**config: Any) -> str:
        run = defs.get_job_def("table_maintenance").execute_in_process(
            instance=instance, run_config={"ops": {"maintain_tables": {"config": config}}}
        )
        assert run.success
        observed = instance.fetch_observations(dg.AssetKey("ledgerless"), limit=1).records
        return str(_meta(observed[0].asset_observation)["maintenance"])

    # within the retention (and with the step off) the audit stays and holds compaction off
    kept = maintain(older_than_hours=0)
    assert "audits: dropped 0 stale audit branch(es)" in kept
    assert "compact: skipped (an audit is staged on branch audit-abandoned" in kept
    off = maintain(audits=False, audit_retention_hours=0, expire=False, orphans=False)
    assert "audits:" not in off and "compact: skipped" in off
    assert runtime.publisher.ledger.audit_log.audit("ledgerless", "abandoned").state == "staged"

    done = maintain(audit_retention_hours=0, older_than_hours=0)
    assert "audits: dropped 1 stale audit branch(es): audit-abandoned" in done
    assert "rewrote 9 data file(s) into 1 file(s)" in done
    table = runtime.iceberg.load(spec)
    assert "audit-abandoned" not in table.metadata.refs and len(table.snapshots()) == 1
    assert runtime.publisher.ledger.audit_log.audit("ledgerless", "abandoned").state == "dropped"
    assert_same_multiset(runtime.iceberg.read(spec), pl.concat(written))  # never published


@dataset(primary_key="id", strategy="snapshot_replace", mode="iceberg")
def tidy() -> pl.DataFrame:
    """A table of one file (never past its thresholds)."""
    return SEED


def test_the_opt_in_sensor_launches_maintenance_for_a_table_past_its_thresholds_only(env, instance):
    defs = build_definitions(
        datasets=[ledgerless, tidy],
        health_thresholds=HealthThresholds(max_small_files=8),
        maintenance_sensor_interval_seconds=60,
    )
    sensor = defs.get_sensor_def("table_maintenance_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED  # opt-in
    assert sensor.minimum_interval_seconds == 60 and sensor.job_name == "table_maintenance"

    def tick() -> Any:
        return sensor(dg.build_sensor_context(instance=instance, definitions=defs))

    assert isinstance(tick(), dg.SkipReason)  # no tables yet
    assert dg.materialize([ledgerless, tidy], instance=instance, resources=defs.resources).success
    healthy = tick()
    assert isinstance(healthy, dg.SkipReason) and "2 table(s) within" in str(healthy.skip_message)

    spec = spec_of(ledgerless)
    assert spec is not None
    written = [SEED]
    for w in range(1, 21):  # 21 small files: past max_small_files=8
        rows = pl.DataFrame({"id": [w * 100 + i for i in range(5)], "v": [f"w{w}"] * 5})
        get_runtime().iceberg.write(spec, rows)
        written.append(rows)
    due = tick()
    assert isinstance(due, dg.SensorResult)
    (request,) = due.run_requests or []  # for ledgerless only, not for tidy
    assert request.tags["pipeline-output/maintained-dataset"] == "ledgerless"
    assert "21 small data files" in request.tags["pipeline-output/health"]

    # the run the daemon launches for it: the maintenance job with the request's config
    run = defs.get_job_def("table_maintenance").execute_in_process(
        instance=instance, run_config=request.run_config, tags=dict(request.tags)
    )
    assert run.success
    table = get_runtime().iceberg.load(spec)
    assert table is not None and len(list(table.scan().plan_files())) == 1
    assert_same_multiset(get_runtime().iceberg.read(spec), pl.concat(written))
    assert isinstance(tick(), dg.SkipReason)  # healthy again: nothing launched
    untouched = get_runtime().iceberg.load("tidy")
    assert untouched is not None and LAST_COMPACTION not in untouched.metadata.properties


def test_the_maintenance_sensor_can_start_running_and_launches_nothing_while_a_run_is_in_flight(
    env, instance
):
    defs = build_definitions(
        datasets=[ledgerless],
        health_thresholds=HealthThresholds(max_snapshots=2),
        maintenance_sensor_running=True,
    )
    sensor = defs.get_sensor_def("table_maintenance_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert dg.materialize([ledgerless], instance=instance, resources=defs.resources).success
    spec = spec_of(ledgerless)
    assert spec is not None
    for w in range(1, 4):  # 4 snapshots: past max_snapshots=2
        get_runtime().iceberg.write(spec, pl.DataFrame({"id": [w * 100], "v": ["x"]}))
    due = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    assert isinstance(due, dg.SensorResult) and len(due.run_requests or []) == 1
    (request,) = due.run_requests or []
    assert "4 snapshots" in request.tags["pipeline-output/health"]
    instance.add_run(  # a maintenance run of the table, in progress
        dg.DagsterRun(
            job_name="table_maintenance",
            run_id="in-flight",
            status=dg.DagsterRunStatus.STARTED,
            tags=dict(request.tags),
        )
    )
    assert isinstance(
        sensor(dg.build_sensor_context(instance=instance, definitions=defs)), dg.SkipReason
    )
