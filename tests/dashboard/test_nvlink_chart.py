"""The NVLink chart in Debian's chromium: drawn only for the devices whose samples carry NVLink
throughput, and not shown at all for a node where none does (a chart with no source is not drawn).

Simulated agents send the lab fleet's heartbeats; node-a's NVLinked A100s (gpu0-3) report NVLink
throughput as an agent does, its T4s (gpu4, gpu5) and every other node's cards report none.
"""

from __future__ import annotations

import pytest

from tests.dashboard import browser
from tests.dashboard.browser import SeededServer, SimulatedAgents, logged_in_page
from tests.dashboard.seed import OPERATOR

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("playwright.sync_api")
NVLINKED = {("node-a", i) for i in range(4)}


def heartbeat_with_nvlink(agent: dict, stages: list[dict], seq: int) -> dict:
    message = plain_heartbeat(agent, stages, seq)
    for device in message["devices"]:
        if (agent["node"], device["index"]) in NVLINKED:
            device["nvlink_tx_bytes_per_s"] = 1e9 * (1 + device["index"])
            device["nvlink_rx_bytes_per_s"] = 5e8
    return message


plain_heartbeat = browser.heartbeat


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    server = SeededServer(tmp_path_factory.mktemp("var"), "lab_with_deployment")
    browser.heartbeat = heartbeat_with_nvlink
    agents = SimulatedAgents(server.url, server.seed["agents"], server.seed["stages"])
    try:
        with logged_in_page(server.url, OPERATOR) as page:
            yield page
    finally:
        browser.heartbeat = plain_heartbeat
        agents.stop()
        server.stop()


def traces(page, chart: str) -> list[str]:
    return page.evaluate(f"(document.getElementById('{chart}').data || []).map((t) => t.name)")


def test_the_nvlink_chart_has_a_trace_per_reporting_device_and_grows_live(page):
    page.goto("/utilization/")
    page.wait_for_selector("#live-status[data-state=live]")
    page.wait_for_function("document.getElementById('chart-nvlink').data?.length > 0")
    assert page.locator("#chart-nvlink").is_visible()
    assert traces(page, "chart-nvlink") == [f"node-a/gpu{i}" for i in range(4)]  # not the T4s
    assert len(traces(page, "chart-pcie")) == 6  # every card has PCIe
    points = "document.getElementById('chart-nvlink').data[0].x.length"
    before = page.evaluate(points)
    page.wait_for_function(f"{points} >= {before + 3}")
    assert page.evaluate("document.getElementById('chart-nvlink').data[3].y.at(-1)") == pytest.approx(4.5)


def test_a_node_without_nvlink_figures_shows_no_nvlink_chart(page):
    page.goto("/utilization/")
    page.wait_for_selector("#live-status[data-state=live]")
    page.select_option("#node-filter", "node-c")
    page.wait_for_function("document.getElementById('chart-pcie').data?.length === 3")
    assert not page.locator("#chart-nvlink").is_visible()
    assert traces(page, "chart-nvlink") == []
    page.select_option("#node-filter", "node-a")
    page.wait_for_function("document.getElementById('chart-nvlink').data?.length === 4")
    assert page.locator("#chart-nvlink").is_visible()
