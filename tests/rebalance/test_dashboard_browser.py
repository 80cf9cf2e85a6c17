"""The rebalance policy's open proposal in Debian's chromium: the Deployments page and the plan
editor show it (trigger, reason, gain, what moves) with Accept and Dismiss; Dismiss closes it."""

from __future__ import annotations

import pytest

from tests.dashboard.browser import SeededServer, logged_in_page
from tests.dashboard.seed import OPERATOR

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("playwright.sync_api")

BOX = "[data-proposal]:not([hidden])"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = SeededServer(tmp_path_factory.mktemp("var"), "lab_with_proposal")
    yield server
    server.stop()


def test_the_open_proposal_is_shown_and_dismissed(server):
    deployment = server.seed["deployment_id"]
    with logged_in_page(server.url, OPERATOR) as page:
        page.goto("/deployments/")
        box = page.locator(BOX)
        box.wait_for()
        text = box.inner_text()
        for fragment in ("Rebalance proposed", "(fleet)", "node-a/gpu0", "joined"):
            assert fragment in text
        assert "tokens/s against" in text and box.locator("ul.diff li").count() > 0
        assert box.locator("button[data-decide=accept]").is_visible()

        page.goto(f"/deployments/{deployment}/plan/")
        box = page.locator(BOX)
        box.wait_for()
        assert "node-a/gpu0" in box.inner_text()
        box.locator("button[data-decide=dismiss]").click()
        page.locator("[data-proposal]").wait_for(state="hidden")
        answer = page.evaluate(f"fetch('/api/v1/deployments/{deployment}/proposals/').then(r => r.json())")
        assert [p["status"] for p in answer["results"]] == ["dismissed"]
