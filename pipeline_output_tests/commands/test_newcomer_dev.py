"""`pipeline-output dev` serves the newcomer's project (issue 32), not the demo: started from the
project's directory on a free port (the location its pyproject.toml names), its GraphQL shows the
project's assets, sensor and checks and none of the demo's; the daemon talks to the same
long-running code server as the webserver (no import of the code location per tick); the
source is observed, carries its kind and its readers' group; the parity check of a dataset
written to one arm is skipped, not passed. Stopping it leaves no process behind. And `dev`
takes `-m/-f` and PIPELINE_OUTPUT_DEFINITIONS as every command does (`dev -p 3333 -m ...` used
to fail with "Invalid set of CLI arguments"), checked with a stand-in `dagster` executable that
records the command line it is given.
"""

from __future__ import annotations

from pathlib import Path

from pipeline_output_tests.commands import user_project as up
from pipeline_output_tests.commands.cli_runner import CLI, isolated_env, runner
from pipeline_output_tests.processes import graphql, processes_under, running_dev

ASSETS = """
{
  assetNodes { assetKey { path } groupName kinds }
  workspaceOrError { ... on Workspace { locationEntries { name
    locationOrLoadError { ... on RepositoryLocation { repositories { sensors { name } } } } } } }
}
"""

SOURCE = """
query ($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset { assetObservations(limit: 1) { runId metadataEntries { label } } }
  }
}
"""

CHECKS = """
query ($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks {
      name executionForLatestMaterialization { status } } } } }
  }
}
"""

DEMO_ASSETS = {"customers", "orders_raw_demo", "active_products", "daily_revenue", "order_events"}


def test_dev_serves_the_project_it_is_started_in_and_leaves_nothing_running(
    tmp_path: Path, pg_db_url: str
) -> None:
    root = up.make_project(tmp_path / "orders-project", pg_db_url)
    env = isolated_env(tmp_path, pg_db_url)
    up.ok(runner(env=env, cwd=root)("materialize"))  # observations, checks: something to show
    command = [CLI, "dev"]  # from the project's directory: its pyproject.toml names the location
    with running_dev(command, env=env, cwd=root, log=tmp_path / "dev.log", root=tmp_path) as port:
        data = graphql(port, ASSETS)
        nodes = {"/".join(n["assetKey"]["path"]): n for n in data["assetNodes"]}
        [location] = data["workspaceOrError"]["locationEntries"]
        sensors = {
            s["name"]
            for repo in location["locationOrLoadError"]["repositories"]
            for s in repo["sensors"]
        }
        observed = graphql(port, SOURCE, {"path": ["orders_raw"]})["assetOrError"]
        checks = graphql(port, CHECKS, {"path": ["region_totals"]})["assetNodeOrError"]
        running = processes_under(tmp_path)
        # one code server for the location; the daemon and the webserver load it through gRPC
        [daemon] = [c for c in running if "dagster._daemon run" in c]
        daemon_workspace = Path(daemon.split("--workspace ", 1)[1].split()[0]).read_text()
    assert set(nodes) == {"orders_raw", "orders", "order_changes", "region_totals", "order_scores"}
    assert not set(nodes) & DEMO_ASSETS
    assert location["name"] == "orders_pipeline.definitions"
    assert sensors == {"order_changes__window_sensor", "table_maintenance_sensor"}
    # the source: its kind, its readers' group, observed by the sensor (materialize ran it)
    assert nodes["orders_raw"]["kinds"] == ["postgres"]
    assert nodes["orders_raw"]["groupName"] == "orders"
    [observation] = observed["assetObservations"]
    labels = {e["label"] for e in observation["metadataEntries"]}
    assert {"dagster/row_count", "high_water_mark", "watermark"} <= labels, labels
    # parity on a dataset written to Iceberg only: skipped, not passed
    status = {
        c["name"]: (c["executionForLatestMaterialization"] or {}).get("status")
        for c in checks["assetChecksOrError"]["checks"]
    }
    assert status["parity"] == "SKIPPED", status
    assert status["revenue_not_negative"] == "SUCCEEDED", status
    servers = [c for c in running if "code-server start" in c]
    assert len(servers) == 1 and "-m orders_pipeline.definitions" in servers[0], running
    assert "grpc_server" in daemon_workspace, "the daemon loads the code location itself"
    assert processes_under(tmp_path) == [], "dev left processes behind"


FAKE_DAGSTER = """#!/bin/sh
# stands in for `dagster`: records the command line `pipeline-output dev` execs, and the
# workspace file it names
printf '%s\\n' "$@" > "$FAKE_DAGSTER_OUT"
cat "$3" >> "$FAKE_DAGSTER_OUT"
"""


def test_dev_takes_the_code_location_options_of_every_command(
    tmp_path: Path, pg_db_url: str
) -> None:
    """`-m`, `-f` and PIPELINE_OUTPUT_DEFINITIONS choose what `dagster dev` serves (the workspace
    it is given); `dev`'s own options never reach `dagster dev`, the others do."""
    root = up.make_project(tmp_path / "orders-project", pg_db_url)
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    fake = bin_dir / "dagster"
    fake.write_text(FAKE_DAGSTER)
    fake.chmod(0o755)
    out = tmp_path / "argv.txt"
    env = isolated_env(tmp_path, pg_db_url)
    env.update(PATH=f"{bin_dir}:{env['PATH']}", FAKE_DAGSTER_OUT=str(out))
    cli = runner(env=env, cwd=root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    defs_file = root / "orders_pipeline" / "definitions.py"
    cases = [
        (("dev", "-p", "3333", "-m", "orders_pipeline.definitions"), root, {}),
        (("dev", "-f", str(defs_file), "-p", "3333"), elsewhere, {}),
        (
            ("dev", "-p", "3333"),
            root,
            {"PIPELINE_OUTPUT_DEFINITIONS": "orders_pipeline.definitions:defs"},
        ),
    ]
    for args, cwd, extra in cases:
        up.ok(cli(*args, cwd=cwd, env=extra))
        argv, _, workspace = out.read_text().partition("load_from:")
        lines = argv.split()
        assert lines[:2] == ["dev", "-w"] and lines[3:] == ["-p", "3333"], (args, lines)
        assert "orders_pipeline" in workspace and "pipeline_output.definitions" not in workspace
        assert ("definitions.py" in workspace) == ("-f" in args), workspace
