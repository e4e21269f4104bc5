"""The UI checked in a real browser (issue 15): `pipeline-output dev` on a free port, headless
Chromium from Debian's packages driven over the Chrome DevTools protocol (playwright's Python
client with `executable_path`: it downloads no browser build), the demo code location.

From the asset page's launchpad the test materialises `active_products` with `dry_run` (the plan
shows as an observation) and then for real with `audit` (staged, checked, published — through
the UI's multiprocess runs), and checks that the rendered pages show the write-mode metadata and
the checks (`parity` skipped: the dataset is written to one arm), and that after a range run (one
`materialize` over two windows of `customers`) each window's partition page shows its own
figures (issue 32). Screenshots go to `$CI_ARTIFACTS/browser` (default `.ci/artifacts/browser`, gitignored).

Skipped, saying why, only where Chromium is not installed: `apt-get install -y chromium`.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from pipeline_output_tests.commands.cli_runner import CLI, isolated_env, runner
from pipeline_output_tests.processes import graphql, running_dev

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
RUN_TIMEOUT_S = 300
RELOAD_TIMEOUT_S = 180
UI_TIMEOUT_MS = 60_000

CHECKS = """
query ($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks {
      name executionForLatestMaterialization { status } } } } }
  }
}
"""

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


@pytest.fixture
def dev_server(tmp_path: Path, pg_db_url: str) -> Iterator[int]:
    """`pipeline-output dev` on a free port over the seeded demo shop, after a range run: the
    CLI plans `customers`' first window (materialising another dataset), the shop advances one
    day, and `materialize --select customers` applies both windows in one run. Every process
    dev started (webserver, daemon, code servers, runs) is ended afterwards."""
    from pipeline_output.demo import shop_data

    shop_data.seed(pg_db_url)
    env = isolated_env(tmp_path, pg_db_url)
    cli = runner(env=env, cwd=tmp_path)
    for args in (
        ("materialize", "--select", "order_events"),
        ("demo", "tick"),
        ("materialize", "--select", "customers"),
    ):
        done = cli(*args)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "2 windows" in done.stdout, done.stdout  # one run over both windows
    log = tmp_path / "dev.log"
    try:
        with running_dev([CLI, "dev"], env=env, cwd=tmp_path, log=log, root=tmp_path) as port:
            yield port
    finally:
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
            expect(page.get_by_text("Skipped").first).to_be_visible()  # parity's evaluation
            page.screenshot(path=str(shots / "5-checks.png"), full_page=True)
            checks = graphql(dev_server, CHECKS, {"path": ["active_products"]})
            status = {
                c["name"]: (c["executionForLatestMaterialization"] or {}).get("status")
                for c in checks["assetNodeOrError"]["assetChecksOrError"]["checks"]
            }
            # written to Iceberg only: parity has nothing to compare and says so (skipped)
            assert status == {"parity": "SKIPPED", "table_health": "SUCCEEDED"}, status

            # the range run applied two windows: each partition shows its own figures
            ledger = {w.seq: w for w in WindowLedger(pg_db_url).windows("customers")}
            figures = []
            for seq in (1, 2):
                key = ledger[seq].partition_key
                page.goto(f"{base}/assets/customers?view=partitions&partition={quote(key)}")
                row = page.locator("tr", has_text="dagster/partition_row_count").first
                expect(row).to_be_visible()
                page.screenshot(path=str(shots / f"6-window-{seq}.png"), full_page=True)
                (shots / f"6-window-{seq}.txt").write_text(page.inner_text("body"))
                figures.append(
                    (
                        row.inner_text().split()[-1],
                        page.locator("tr", has_text="snapshot_id").first.inner_text().split()[-1],
                    )
                )
            assert figures[0][0] != figures[1][0], figures  # 400 seeded customers vs one day's
            assert figures[0][1] != figures[1][1], figures  # each window's own snapshot
            assert [f[0] for f in figures] == [
                str(ledger[1].rows_read),
                str(ledger[2].rows_read),
            ], figures
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

    from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime

    cli = runner(env=isolated_env(tmp_path, pg_db_url), cwd=tmp_path)
    materialised = cli("materialize", "--select", "active_products")
    assert materialised.returncode == 0, materialised.stderr[-3000:]
    locations = graphql(
        dev_server,
        "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }",
    )["workspaceOrError"]["locationEntries"]
    for entry in locations:  # a reload restarts the code server: slow on a busy machine
        graphql(
            dev_server,
            "mutation ($name: String!) { reloadRepositoryLocation("
            "repositoryLocationName: $name) { __typename } }",
            {"name": entry["name"]},
            timeout=RELOAD_TIMEOUT_S,
        )
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
