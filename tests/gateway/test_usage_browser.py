"""The Usage page in Debian's chromium against a real gateway process: requests served through /v1/ (and
some refused by a key's limit) appear in its totals and chart, the grouping switches, the CSV link
downloads the same figures. Screenshot in test-artifacts/screenshots/usage.png."""

from __future__ import annotations

import csv
import io

import pytest

from tests.dashboard.browser import SCREENSHOTS, chromium_page, log_in
from tests.gateway.test_quota_processes import complete, install, next_window
from tests.support.processes import manage_shell
from tests.telemetry.test_shared_state import Server

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(180)]
pytest.importorskip("playwright.sync_api")

PASSWORD = "SET = 'correct horse battery'; from django.contrib.auth import get_user_model; " \
           "u = get_user_model().objects.get(username='ops'); u.set_password(SET); u.save()"


def test_the_usage_page_shows_what_the_gateway_served(tmp_path, demo_model):
    env, seed = install(tmp_path / "var", demo_model, service=False)
    manage_shell(env, PASSWORD)
    server = Server(env, tmp_path / "server.log")
    try:
        served = [complete(server, seed["free"], max_tokens=n) for n in (1, 2, 3)]
        next_window()
        served += [complete(server, seed["rpm"]) for _ in range(6)]  # 4 per window: 2 refused
        ok = [r.json()["usage"] for r in served if r.status_code == 200]
        refused = sum(r.status_code == 429 for r in served)
        assert refused == 2
        tokens = sum(u["total_tokens"] for u in ok)
        with chromium_page(server.url) as page:
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            log_in(page, ("ops", "correct horse battery"))
            page.click("nav >> text=Usage")
            page.wait_for_url("**/usage/")
            page.locator("#usage-chart .trace").first.wait_for()
            total = page.locator('#usage-totals [data-total="total_tokens"]').inner_text()
            assert int(total) == tokens
            assert int(page.locator('#usage-totals [data-total="refused"]').inner_text()) == refused
            assert page.locator("#usage-totals tbody tr").count() == 2  # the keys "free" and "rpm"
            drawn = page.evaluate("() => document.getElementById('usage-chart').data"
                                  ".reduce((s, t) => s + t.y.reduce((a, b) => a + b, 0), 0)")
            assert drawn == tokens
            page.locator("#usage-chart").screenshot(path=str(SCREENSHOTS / "usage-chart.png"))
            page.screenshot(path=str(SCREENSHOTS / "usage.png"), full_page=True)
            page.select_option("#group-by", "model")
            page.locator("#group-heading", has_text="Model").wait_for()
            rows = page.locator("#usage-totals tbody tr")
            assert rows.count() == 1 and rows.first.locator("td").first.inner_text() == "demo"
            page.select_option("#metric", "requests")
            drawn = page.evaluate("() => document.getElementById('usage-chart').data"
                                  ".reduce((s, t) => s + t.y.reduce((a, b) => a + b, 0), 0)")
            assert drawn == len(ok) == 7
            href = page.locator("#csv-link").get_attribute("href")
            assert "format=csv" in href and "group_by=model" in href
            lines = list(csv.DictReader(io.StringIO(page.request.get(href).text())))
            assert sum(int(line["total_tokens"]) for line in lines) == tokens
            assert not errors, errors
    finally:
        server.stop()
