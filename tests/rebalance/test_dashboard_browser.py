"""The rebalance policy's open proposal in Debian's chromium: the Deployments page and the plan
editor show it (trigger, reason, gain, what moves) with Accept and Dismiss; Dismiss closes it; the
demand proposal the policy makes next shows its prediction at the forecast load against the targets.
The plan editor edits the deployment's service-level targets through the deployments API, each
refusal next to its field. The tests share the module's server, in any order."""

from __future__ import annotations

import json

import pytest

from tests.dashboard.browser import SeededServer, logged_in_page
from tests.dashboard.seed import OPERATOR
from tests.support.processes import manage_shell

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = pytest.importorskip("playwright.sync_api").expect

BOX = "[data-proposal]:not([hidden])"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = SeededServer(tmp_path_factory.mktemp("var"), "lab_with_proposal")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(server):
    with logged_in_page(server.url, OPERATOR) as page:
        yield page


def deployment_read(page, deployment: int) -> dict:
    return page.evaluate(f"fetch('/api/v1/deployments/{deployment}/').then(r => r.json())")


def test_the_open_proposal_is_shown_and_dismissed_and_a_demand_proposal_shows_its_forecast(server, page):
    deployment = server.seed["deployment_id"]
    page.goto("/deployments/")
    box = page.locator(BOX)
    box.wait_for()
    text = box.inner_text()
    for fragment in ("Rebalance proposed", "(fleet)", "node-a/gpu0", "joined"):
        assert fragment in text
    assert "tokens/s against" in text and box.locator("ul.diff li").count() > 0
    assert box.locator("button[data-decide=accept]").is_visible()
    assert box.locator(".forecast").count() == 0  # a fleet proposal has no forecast

    page.goto(f"/deployments/{deployment}/plan/")
    box = page.locator(BOX)
    box.wait_for()
    assert "node-a/gpu0" in box.inner_text()
    box.locator("button[data-decide=dismiss]").click()
    page.locator("[data-proposal]").wait_for(state="hidden")
    answer = page.evaluate(f"fetch('/api/v1/deployments/{deployment}/proposals/').then(r => r.json())")
    assert [p["status"] for p in answer["results"]] == ["dismissed"]

    # Load near the plan's capacity and a TTFT over its target: a demand proposal, with its forecast.
    script = ("import json; from tests.dashboard.seed import demand_proposal_create as c; "
              f"print('FORECAST=' + json.dumps(c({deployment})))")
    forecast = json.loads(manage_shell(server.env, script).split("FORECAST=", 1)[1])
    assert forecast["ttft_ms"] > forecast["ttft_target_ms"] == 400 and forecast["meets"] is False
    page.goto("/deployments/")
    box = page.locator(BOX)
    expect(box.locator(".forecast")).to_be_visible()
    assert "(demand)" in box.inner_text()
    load = box.locator("[data-forecast=load]").inner_text()
    assert f"{forecast['forecast_output_tokens_per_s']:.1f} output tokens/s" in load
    capacity = f"{forecast['capacity_tokens_per_s']:.1f} tokens/s with {forecast['replicas']} replica(s)"
    assert f"capacity of {capacity}" in load
    assert f"{round(100 * forecast['utilisation'])} % of it" in load
    assert box.locator("th", has_text=f"predicted p{forecast['percentile']}").count() == 1
    ttft = box.locator("tr[data-forecast=ttft] td").all_inner_texts()
    assert ttft == ["time to first token", f"{forecast['ttft_ms']:.0f} ms", "400 ms", "over"]
    assert box.locator("tr[data-forecast=ttft] td.error").count() == 1
    tpot = box.locator("tr[data-forecast=tpot] td").all_inner_texts()
    assert tpot == ["time per output token", f"{forecast['tpot_ms']:.0f} ms", "no target", "—"]
    verdict = box.locator("[data-forecast=verdict]")
    assert verdict.get_attribute("data-meets") == "false"
    assert "does not meet the targets" in verdict.inner_text()


def test_the_plan_editor_saves_targets_and_shows_a_refusal_next_to_its_field(server, page):
    deployment = server.seed["deployment_id"]
    page.goto(f"/deployments/{deployment}/plan/")
    form = page.locator("#targets-form")
    result = page.locator("#targets-result")
    form.locator("[name=ttft_target_ms]").fill("250")
    form.locator("[name=tpot_target_ms]").fill("40")
    form.locator("[name=target_percentile]").select_option("99")
    form.locator("[name=min_replicas]").fill("2")
    form.locator("[name=max_replicas]").fill("")
    form.locator("#targets-save").click()
    expect(result).to_have_class("ok")
    saved = deployment_read(page, deployment)
    assert (saved["ttft_target_ms"], saved["tpot_target_ms"], saved["target_percentile"]) == (250, 40, 99)
    assert (saved["min_replicas"], saved["max_replicas"]) == (2, None)

    form.locator("[name=target_window_s]").fill("5")  # under the API's 10 s
    form.locator("#targets-save").click()
    expect(result).to_have_class("error")
    expect(form.locator("[data-error-for=target_window_s]")).to_contain_text("10")
    assert form.locator("[data-error-for=ttft_target_ms]").inner_text() == ""

    form.locator("[name=target_window_s]").fill("120")
    form.locator("[name=max_replicas]").fill("1")  # fewer than the least: the service's check
    form.locator("#targets-save").click()
    expect(form.locator("[data-error-for=max_replicas]")).to_contain_text("at least min_replicas (2)")
    expect(form.locator("[data-error-for=target_window_s]")).to_have_text("")
    unchanged = deployment_read(page, deployment)
    assert (unchanged["target_window_s"], unchanged["max_replicas"]) == (saved["target_window_s"], None)

    page.reload()  # what was saved is what the page is served with
    assert form.locator("[name=ttft_target_ms]").input_value() == "250"
    assert form.locator("[name=target_percentile]").input_value() == "99"
