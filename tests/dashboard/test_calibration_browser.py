"""Calibration figures in Debian's chromium: the deployments page's table and the plan editor's, filled
by the pages' scripts from GET /api/v1/plans/calibration/, against a real server fed by simulated
agents whose stage statistics carry decode figures. Screenshots in test-artifacts/screenshots/."""

from __future__ import annotations

import subprocess

import pytest

from tests.dashboard import browser
from tests.dashboard.browser import SCREENSHOTS, SeededServer, SimulatedAgents, logged_in_page
from tests.dashboard.seed import OPERATOR
from tests.support.processes import REPO_ROOT, manage_argv

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = pytest.importorskip("playwright.sync_api").expect
STORE = """
from controlplane.inventory.models import Device, DeviceCalibration
a100 = Device.objects.get(node__name="node-a", index=0)
DeviceCalibration.objects.create(device=a100, bits=16, ratio=2.5, samples=8,
                                 window=[[1000.0 + i, 2.5, "d1-r0-s0"] for i in range(8)])
"""


def with_decode_figures(heartbeat):
    """The simulated agents' heartbeat, each stage's statistics with decode figures (contracts §4)."""
    def beat(agent, stages, seq):
        message = heartbeat(agent, stages, seq)
        for status in message["stages"]:
            status["stats"].update(decode_steps=20, decode_ms=25.0 + status["stage_index"], decode_batch=4,
                                   decode_kv_tokens=4 * 700)
        return message
    return beat


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    server = SeededServer(tmp_path_factory.mktemp("var"), "lab_with_deployment")
    subprocess.run(manage_argv("shell", "-c", STORE), env=server.env, cwd=REPO_ROOT, check=True)
    patch = pytest.MonkeyPatch()
    patch.setattr(browser, "heartbeat", with_decode_figures(browser.heartbeat))
    agents = SimulatedAgents(server.url, server.seed["agents"], server.seed["stages"])
    try:
        with logged_in_page(server.url, OPERATOR) as page:
            yield page
    finally:
        agents.stop()
        patch.undo()
        server.stop()


def row_cells(row) -> dict[str, str]:
    """The text of each figure of a calibration row, read at one moment."""
    return row.evaluate("row => Object.fromEntries([...row.querySelectorAll('[data-cal]')]"
                        ".map(cell => [cell.dataset.cal, cell.textContent]))")


def test_deployments_page_shows_raw_calibrated_and_measured_per_stage(page):
    page.goto("/deployments/")
    row = page.locator('tr[data-calibration-stage="d1-r0-s0"]')  # node-a/gpu0, calibrated x2.5
    # Each refresh refills the row whole; on a loaded host one may find the agents' telemetry stale for a
    # moment and show dashes: the figures are read from one refill, once it carries them.
    expect(row.locator('[data-cal="error"]')).to_contain_text("→")
    cells = row_cells(row)
    for _ in range(20):
        if "—" not in cells["measured_ms"]:
            break
        page.wait_for_timeout(500)
        cells = row_cells(row)
    assert cells["measured_ms"] == "25.000 ms"
    assert cells["factor"] == "×2.50 (8 samples)"
    assert cells["load"] == "4.0 seq × 700 tok"
    raw, calibrated = (float(cells[key].split()[0]) for key in ("raw_ms", "calibrated_ms"))
    assert calibrated == pytest.approx(2.5 * raw, rel=1e-3)
    # The other A100s were never measured: their GPU model's factor.
    other = page.locator('tr[data-calibration-stage="d1-r1-s0"] [data-cal="factor"]')
    assert other.inner_text() == "×2.50 (its GPU model's)"
    table = page.locator('table[data-calibration="1"]')
    table.screenshot(path=str(SCREENSHOTS / "calibration-deployments.png"))


def test_plan_editor_shows_raw_calibrated_and_measured_per_stage(page):
    page.goto("/deployments/1/plan/")
    first = page.locator('#stage-predictions tr[data-device="node-a/gpu0"]').first
    first.filter(has_text="seq").wait_for()
    cells = [c.inner_text() for c in first.locator("td").all()]
    assert cells[0] == "r0 s0" and cells[3] == "×2.50 (8 samples)"
    assert float(cells[4]) == pytest.approx(2.5 * float(cells[2]), rel=1e-3)
    assert cells[5].startswith("25.000 ms") and "at 4.0 seq × 700 tok: predicted" in cells[5]
    page.locator("#stage-prediction-table").screenshot(path=str(SCREENSHOTS / "calibration-editor.png"))
