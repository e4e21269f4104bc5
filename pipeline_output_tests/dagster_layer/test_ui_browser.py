"""The UI checked in a real browser (issue 15): `pipeline-output dev` on a free port, headless
Chromium from Debian's packages driven over the Chrome DevTools protocol (playwright's Python
client with `executable_path`: it downloads no browser build), the demo code location.

From the asset page's launchpad the test materialises `active_products` with `dry_run` (the plan
shows as an observation) and then for real with `audit` (staged, checked, published — through
the UI's multiprocess runs), and checks that the rendered pages show the write-mode metadata, the
passed `parity` check and the delta dataset's window partitions (planned by the sensor the daemon
runs). Screenshots go to `$CI_ARTIFACTS/browser` (default `.ci/artifacts/browser`, gitignored).

Skipped, saying why, only where Chromium is not installed: `apt-get install -y chromium`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline_output_tests.commands.cli_runner import CLI, isolated_env
from pipeline_output_tests.processes import end_leftovers, free_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_TIMEOUT_S = 180
RUN_TIMEOUT_S = 300
UI_TIMEOUT_MS = 60_000

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (/usr/bin/chromium); install it with "
    "`apt-get install -y chromium` (CI's .ci/run does)",
)


def artifacts() -> Path:
    """Where screenshots go: $CI_ARTIFACTS/browser, else .ci/artifacts/browser in the checkout."""
    root = Path(os.environ.get("CI_ARTIFACTS") or REPO / ".ci" / "artifacts")
    folder = root / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def graphql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]  # type: ignore[no-any-return]


@pytest.fixture
def dev_server(tmp_path: Path, pg_db_url: str) -> Iterator[int]:
    """`pipeline-output dev` on a free port over the seeded demo shop; every process it started
    (webserver, daemon, code servers, runs) is ended afterwards."""
    from pipeline_output.demo import shop_data

    shop_data.seed(pg_db_url)
    port = free_port()
    log = tmp_path / "dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [CLI, "dev", "-h", "127.0.0.1", "-p", str(port)],
            env=isolated_env(tmp_path, pg_db_url),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pipeline-output dev exited ({proc.returncode}):\n{log.read_text()}")
            try:
                if graphql(port, "{ assetNodes { id } }")["assetNodes"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"UI not up:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        graphql(port, "mutation { setNuxSeen }")  # no "join the community" modal over the UI
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # dagster dev shuts its children down on SIGINT
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        end_leftovers(tmp_path)
        shutil.copy(log, artifacts() / "dev.log")


def launch_from_launchpad(page: Any, base: str, asset: str, config: str) -> str:
    """Open `asset`'s launchpad, replace its config with `config`, materialise; the run id."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    page.goto(f"{base}/assets/{asset}")
    # the dropdown next to the page header's Materialize button (not a section's caret)
    caret = page.locator(
        "xpath=(//button[normalize-space(.)='Materialize'])[1]/following::button[1]"
    )
    expect(caret).to_be_enabled(timeout=UI_TIMEOUT_MS)
    item = page.get_by_role("menuitem", name="Open launchpad")
    deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
    while True:  # a click while the page still re-renders can open no menu: click again
        caret.click()
        try:
            item.click(timeout=5_000)
            break
        except PlaywrightTimeout:
            assert time.monotonic() < deadline, "the Materialize menu did not open"
            page.keyboard.press("Escape")
    dialog = page.get_by_role("dialog")
    expect(dialog.locator(".CodeMirror")).to_be_visible(timeout=UI_TIMEOUT_MS)
    # the config editor is CodeMirror: set its text as a user's paste would
    page.evaluate(
        "(text) => document.querySelector('.CodeMirror').CodeMirror.setValue(text)", config
    )
    expect(dialog.get_by_text("No errors")).to_be_visible(timeout=UI_TIMEOUT_MS)
    dialog.get_by_role("button", name="Materialize").click()
    page.wait_for_url("**/runs/**", timeout=UI_TIMEOUT_MS)
    return str(page.url.rstrip("/").split("/runs/")[1].split("?")[0])


def wait_for_success(page: Any, port: int, run_id: str, shot: Path) -> None:
    """Poll the run's status; then show it (the run page) with its status rendered."""
    from playwright.sync_api import expect

    query = "query ($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    status = ""
    while time.monotonic() < deadline:
        status = graphql(port, query, {"id": run_id})["runOrError"].get("status", "")
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(1)
    page.reload()
    expect(page.get_by_text("Success").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(shot), full_page=True)
    assert status == "SUCCESS", f"run {run_id}: {status}"


def test_the_ui_materialises_from_the_launchpad_and_shows_write_mode_parity_and_windows(
    dev_server: int, pg_db_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from pipeline_output.ledger import Ledger
    from pipeline_output.ledger.window_ledger import WindowLedger

    base = f"http://127.0.0.1:{dev_server}"
    shots = artifacts()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            community = page.get_by_text("Join the Dagster community")
            page.add_locator_handler(
                community, lambda: page.get_by_role("button", name="Skip").click()
            )

            dry = launch_from_launchpad(
                page,
                base,
                "active_products",
                "ops:\n  active_products:\n    config:\n      dry_run: true\n",
            )
            wait_for_success(page, dev_server, dry, shots / "1-dry-run.png")
            page.goto(f"{base}/assets/active_products?view=events")
            expect(page.get_by_text("expected_effect")).to_be_visible()
            expect(page.get_by_text("write_mode").first).to_be_visible()
            page.screenshot(path=str(shots / "2-dry-run-observation.png"), full_page=True)

            real = launch_from_launchpad(
                page,
                base,
                "active_products",
                "ops:\n  active_products:\n    config:\n      audit: true\n",
            )
            wait_for_success(page, dev_server, real, shots / "3-run.png")
            page.goto(f"{base}/assets/active_products?view=events")
            expect(page.get_by_text(f"audit-{real}").first).to_be_visible()
            for label in ("write_mode", "rows_inserted", "iceberg/snapshot_id"):
                expect(page.get_by_text(label, exact=True).first).to_be_visible()
            page.screenshot(path=str(shots / "4-materialization.png"), full_page=True)

            page.goto(f"{base}/assets/active_products?view=checks")
            expect(page.get_by_text("parity").first).to_be_visible()
            expect(page.get_by_text("Passed").first).to_be_visible()
            page.screenshot(path=str(shots / "5-parity-check.png"), full_page=True)

            deadline = time.monotonic() + RUN_TIMEOUT_S
            windows = WindowLedger(pg_db_url)
            while not windows.windows("customers") and time.monotonic() < deadline:
                time.sleep(2)  # the daemon's window sensor plans the first window
            assert windows.windows("customers"), "the window sensor planned no window"
            key = windows.windows("customers")[0].partition_key
            page.goto(f"{base}/assets/customers?view=partitions")
            expect(page.get_by_text(key).first).to_be_visible()
            page.screenshot(path=str(shots / "6-window-partitions.png"), full_page=True)
        finally:
            browser.close()
    audit = Ledger(pg_db_url).audit_log.audit("active_products", real)
    assert audit is not None and audit.state == "published", audit


def test_an_asset_page_shows_the_iceberg_column_schema_and_the_table_link(
    dev_server: int, pg_db_url: str, tmp_path: Path
) -> None:
    """After a materialisation and a reload of the code location (which then finds the table),
    the asset page's Storage shows the table name and a link to the table's location, and its
    Columns the Iceberg type names with the primary key's constraint."""
    from playwright.sync_api import expect, sync_playwright

    from pipeline_output.dagster_layer.process_runtime import get_runtime, reset_runtime

    materialised = subprocess.run(
        [CLI, "materialize", "--select", "active_products"],
        env=isolated_env(tmp_path, pg_db_url),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert materialised.returncode == 0, materialised.stderr[-3000:]
    locations = graphql(
        dev_server,
        "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }",
    )["workspaceOrError"]["locationEntries"]
    for entry in locations:  # a reload restarts the code server: slow on a busy machine
        request = urllib.request.Request(
            f"http://127.0.0.1:{dev_server}/graphql",
            data=json.dumps(
                {
                    "query": "mutation ($name: String!) { reloadRepositoryLocation("
                    "repositoryLocationName: $name) { __typename } }",
                    "variables": {"name": entry["name"]},
                }
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=START_TIMEOUT_S) as response:
            assert "errors" not in json.loads(response.read())
    os.environ["PIPELINE_OUTPUT_HOME"] = str(tmp_path / "home")
    os.environ["PIPELINE_OUTPUT_PG_URL"] = pg_db_url
    try:
        reset_runtime()
        table = get_runtime().iceberg.load("active_products")
        assert table is not None
        location = table.location()
    finally:
        del os.environ["PIPELINE_OUTPUT_HOME"], os.environ["PIPELINE_OUTPUT_PG_URL"]
        reset_runtime()

    base = f"http://127.0.0.1:{dev_server}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.set_default_timeout(UI_TIMEOUT_MS)
            community = page.get_by_text("Join the Dagster community")
            page.add_locator_handler(
                community, lambda: page.get_by_role("button", name="Skip").click()
            )
            deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
            link = page.locator(f"a[href='{location}']")
            while True:  # the reloaded location shows once the code server is back
                page.goto(f"{base}/assets/active_products")
                try:
                    expect(link.first).to_be_visible(timeout=10_000)
                    break
                except AssertionError:
                    assert time.monotonic() < deadline, "no table link on the asset page"
            expect(page.get_by_text("default.datasets.active_products").first).to_be_visible()
            for column, kind in (("product_id", "long"), ("name", "string")):
                expect(page.get_by_text(column, exact=True).first).to_be_visible()
                expect(page.get_by_text(kind, exact=True).first).to_be_visible()
            expect(page.get_by_text(re.compile(r"^decimal\(\d+, \d+\)$")).first).to_be_visible()
            page.screenshot(
                path=str(artifacts() / "7-column-schema-and-table-link.png"), full_page=True
            )
        finally:
            browser.close()
