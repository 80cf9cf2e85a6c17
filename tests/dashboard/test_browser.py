"""The dashboard in Debian's chromium, against a real server fed by simulated agents' websockets.

Covers: log in; the topology of an emulated fleet with a running deployment; a utilization chart
updating live from agent telemetry; prefix caching's figures on the Utilization and Deployments pages;
the demand figures following the demand API in place; an invalid plan edit showing the planner's
error; a valid edit applied as a new revision; a plan check answered after a later edit ignored; the
prefix caching switch; a tensor-parallel group's shares in the plan editor, edited and checked; what a
degraded plan lowered, redrawn from the API.
Screenshots of each page go to test-artifacts/screenshots/.
(READY on the new plan needs real agents and stage processes: tests/dashboard/test_e2e.py.)

Each test stands alone, in any order: the read-only ones share a module's server and a page logged in
by its fixture (the group editor's test and the degraded plan's each add a stopped deployment there,
which runs no stage and so changes nothing the others see); the one that applies a new revision has a
server and agents of its own. One chromium serves them all (Playwright's sync API runs one per
thread): a test needing another session opens a context of its own in it.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from contracts.tracing import sink_authorization
from tests.dashboard.browser import (
    SCREENSHOTS,
    SeededServer,
    SimulatedAgents,
    drawing_problems,
    log_in,
    logged_in_page,
    own_context,
)
from tests.dashboard.seed import OPERATOR
from tests.support.processes import REPO_ROOT, manage_argv, manage_shell
from tests.support.trace_samples import request_trace

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = pytest.importorskip("playwright.sync_api").expect


@contextmanager
def seeded_system(var: Path) -> Iterator[tuple[SeededServer, SimulatedAgents]]:
    """A server seeded with the lab and a READY deployment, fed by simulated agents."""
    server = SeededServer(var, "lab_with_deployment")
    try:
        agents = SimulatedAgents(server.url, server.seed["agents"], server.seed["stages"])
        yield server, agents
        try:
            agents.stop()
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nserver log:\n{server.log.read_text()[-4000:]}") from None
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Read-only tests' server: no test here changes its rows."""
    with seeded_system(tmp_path_factory.mktemp("var")) as (server, _):
        yield server


@pytest.fixture(scope="module")
def page(server):
    with logged_in_page(server.url, OPERATOR) as page:
        yield page


def shot(page, name: str, full_page: bool = True) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)


def test_login_leads_to_the_topology(server, page):
    with own_context(page, server.url) as anonymous:
        anonymous.goto("/")
        assert "/accounts/login/" in anonymous.url
        shot(anonymous, "login")
        log_in(anonymous, OPERATOR, start=None)


def test_topology_shows_the_emulated_fleet_the_deployment_and_live_colours(page, server):
    page.goto("/topology/")
    assert page.locator("g.gpu").count() == 13
    assert page.locator("g.gpu.emulated").count() == 13
    assert page.locator("text.node-status", has_text="EMULATED").count() == 3
    stages = page.locator("g.stage")
    assert stages.count() == len(server.seed["stages"])
    assert page.locator("g.stage.bottleneck").count() >= 1
    assert page.locator("path.pipeline-arrow").count() == len(server.seed["stages"]) - _pipelines(server)
    page.wait_for_selector("#live-status[data-state=live]")
    page.wait_for_function("document.querySelectorAll('g.gpu[data-value]').length === 13")  # coloured live
    page.wait_for_function(
        "[...document.querySelectorAll('g.stage')].every(g => g.dataset.state === 'ready')")
    assert drawing_problems(page) == []  # card, stage and bottleneck labels apart, nothing cut off
    shot(page, "topology")


def test_utilization_chart_updates_live_from_agent_telemetry(page):
    page.goto("/utilization/")
    page.wait_for_selector("#live-status[data-state=live]")
    points = "document.getElementById('chart-utilization').data?.[0]?.x?.length || 0"
    page.wait_for_function(f"{points} > 0")
    before = page.evaluate(points)
    page.wait_for_function(f"{points} >= {before + 3}")  # three more agent heartbeats drawn
    assert page.evaluate("document.getElementById('chart-utilization').data.length") == 6  # node-a's GPUs
    page.wait_for_function("document.getElementById('chart-step-split').data?.[0]?.x?.length > 0")
    # Prefix caching: every stage reports a 75 % hit rate and its cached blocks; only heads a host tier.
    page.wait_for_function("document.getElementById('chart-prefix-hit').data?.[0]?.y?.length > 0")
    stages = len(page.evaluate("document.getElementById('chart-tokens').data"))
    assert len(page.evaluate("document.getElementById('chart-prefix-blocks').data")) == stages
    assert page.evaluate("document.getElementById('chart-prefix-hit').data[0].y.at(-1)") == pytest.approx(75)
    heads = page.evaluate("document.getElementById('chart-prefix-host').data.map((t) => t.name)")
    assert heads and all(name.endswith("-s0") for name in heads)
    page.wait_for_timeout(1000)
    shot(page, "utilization")


def test_deployments_page_shows_measured_next_to_predicted(page):
    page.goto("/deployments/")
    page.wait_for_function("document.querySelector('[data-measured=tokens_per_s]').textContent !== '—'")
    assert page.locator("section.deployment .status", has_text="ready").first.is_visible()
    page.wait_for_function("document.querySelector('[data-live=prefix_hit_rate]').textContent === '75 %'")
    head = page.locator("tr[data-stage][data-index='0']").first
    assert head.locator("[data-live=prefix_blocks]").inner_text() == "10 + 5 host"
    assert head.locator("[data-live=spec_acceptance]").inner_text() == "75 %"
    assert head.locator("[data-live=spec_tokens_per_step]").inner_text() == "4.00"
    relay = page.locator("tr[data-stage][data-index='1']").first
    assert relay.locator("[data-live=spec_acceptance]").inner_text() == "—"
    assert page.locator("[data-caching] [data-field=prefix_caching]").first.inner_text() == "on"
    shot(page, "deployments")


POLLED_MS = 15_000  # a few of the page's polls of the demand API (demand.js)


def test_deployments_page_demand_figures_follow_the_demand_api_without_a_reload(page):
    """The agents' KV use and heads' queue move every beat: the demand line follows them in place,
    says when it was answered, and says the figures are stale once the API stops answering."""
    page.goto("/deployments/")
    page.evaluate("window.sameDocument = true")  # gone if the page reloads
    state, signals = page.locator("[data-demand-state]").first, page.locator("[data-signals]").first
    expect(state).to_have_attribute("data-state", "live")
    expect(state).to_contain_text("as of")
    expect(signals).to_contain_text("% (fullest stage)")
    expect(signals).to_contain_text("in the heads' queues")
    first, answered = signals.inner_text(), state.get_attribute("data-at")
    expect(signals).not_to_have_text(first, timeout=POLLED_MS)
    assert float(state.get_attribute("data-at")) > float(answered)
    assert page.locator("[data-demand] tr[data-target=ttft] [data-cell=target]").first.inner_text() == "none"
    page.route("**/demand/", lambda route: route.abort())
    try:
        expect(state).to_have_attribute("data-state", "stale", timeout=POLLED_MS)
        expect(state).to_contain_text("stale: the figures above are from")
    finally:
        page.unroute("**/demand/")  # the module's page serves the other tests
    expect(state).to_have_attribute("data-state", "live", timeout=POLLED_MS)
    assert page.evaluate("window.sameDocument") is True


@pytest.fixture
def own_system(tmp_path, page):
    """A server of this test's own, for a test that changes the deployment, and a page logged in there."""
    with seeded_system(tmp_path / "var") as (server, _), own_context(page, server.url) as own:
        log_in(own, OPERATOR)
        yield server, own


def test_invalid_edit_shows_the_error_a_valid_one_is_applied_and_rebalance_proposes_the_planners_plan(
        own_system):
    server, page = own_system
    page.goto(f"/deployments/{server.seed['deployment_id']}/plan/")
    page.wait_for_selector("#check-status.ok")
    assert page.locator("#apply").is_disabled()  # valid but unchanged
    last_end = page.locator("table.replica-table").first.locator("input.end").last
    last_end.fill("30")
    last_end.dispatch_event("change")
    page.wait_for_selector("#problems li[data-code=layer_missing]")
    assert page.locator("#check-status.error").is_visible()
    assert page.locator("#apply").is_disabled()
    shot(page, "plan-editor-invalid", full_page=False)

    last_end.fill("32")
    last_end.dispatch_event("change")
    page.wait_for_selector("#check-status.ok")
    replica = page.locator("table.replica-table").filter(has=page.locator("tbody tr:nth-child(2)")).first
    # The last layers of a stage at int4 are priced, and over this deployment's quality budget (0).
    tail = replica.locator("select.low-bits").last
    tail.select_option("4")
    page.wait_for_selector("#problems li[data-code=over_quality_budget]")
    assert replica.locator("input.low-from").last.input_value() != ""
    tail.select_option("0")
    page.wait_for_selector("#check-status.ok")
    assert page.locator("#apply").is_disabled()  # back to the applied plan
    # Move the boundary of a two-stage replica by one layer (stage 0 takes one more).
    boundary = replica.locator("input.end").first
    boundary.fill(str(int(boundary.input_value()) + 1))
    boundary.dispatch_event("change")
    page.wait_for_selector("#apply:not([disabled])")
    assert page.locator("#problems li").count() == 0
    shot(page, "plan-editor-valid", full_page=False)
    page.click("#apply")
    assert page.locator("#diff li").count() == 2  # the boundary is both stages' edge
    page.click("#confirm-apply")
    page.wait_for_function("['ok', 'error'].includes(document.getElementById('apply-result').className)")
    result = page.locator("#apply-result")
    assert result.get_attribute("class") == "ok", result.inner_text()
    page.wait_for_url(re.compile(r"/deployments/$"))
    assert "revision 2 applied (edited by an operator)" in page.content()

    # Prefix caching off and on again: the page says so at once and after a reload.
    switch = page.locator(f"[data-caching='{server.seed['deployment_id']}']")
    switch.locator("button", has_text="Turn off").click()
    page.wait_for_function(f"document.querySelector(\"[data-caching='{server.seed['deployment_id']}']\")"
                           ".dataset.on === 'false'")
    # The reload's resync (its read of the deployments) is held until the operator has chosen a
    # speculation mode below: its answer, from before the choice, must not undo it.
    held = []
    page.route("**/api/v1/deployments/?limit=1000", lambda route: held.append(route))
    with page.expect_request("**/api/v1/deployments/?limit=1000"):
        page.reload()
    assert switch.locator("[data-field=prefix_caching]").inner_text() == "off"
    switch.locator("button", has_text="Turn on").click()
    page.wait_for_function(f"document.querySelector(\"[data-caching='{server.seed['deployment_id']}']\")"
                           ".dataset.on === 'true'")
    # Speculation by prompt lookup, at most 6 proposals: applied, and so after a reload.
    speculation = page.locator(f"[data-speculation='{server.seed['deployment_id']}']")
    speculation.locator("[data-field=speculation]").select_option("lookup")
    speculation.locator("[data-field=speculative_tokens]").fill("6")
    assert held, "the reload's resync did not read the deployments"
    with page.expect_response("**/api/v1/deployments/?limit=1000"):
        held.pop().continue_()
    page.unroute("**/api/v1/deployments/?limit=1000")
    page.wait_for_timeout(200)  # the resync's redraw runs as its answer is read
    assert speculation.locator("[data-field=speculation]").input_value() == "lookup"
    speculation.locator("button", has_text="Apply").click()
    speculation.locator("[role=status]", has_text="applied").wait_for()
    page.reload()
    assert speculation.locator("[data-field=speculation]").input_value() == "lookup"
    assert speculation.locator("[data-field=speculative_tokens]").input_value() == "6"

    # Rebalance proposes the planner's plan from current health.
    page.goto(f"/deployments/{server.seed['deployment_id']}/plan/")
    page.wait_for_selector("#check-status.ok")
    page.click("#rebalance")
    page.wait_for_function(
        "document.getElementById('proposal').textContent.startsWith('Proposal from the planner')")
    page.wait_for_selector("#check-status.ok")
    # The fleet did not change since revision 1: the proposal is the planner's plan, so it differs
    # from the applied revision 2 exactly by the boundary the operator moved.
    page.click("#apply")
    assert page.locator("#diff li").count() == 2
    page.keyboard.press("Escape")


def test_a_check_answered_after_a_later_edit_does_not_enable_apply(page, server):
    """Edit A's check is held in flight while edit B makes the plan invalid; A's answer then arrives.
    It priced a plan no longer shown: taken, it would enable Apply (and Apply posts the checked plan).
    The page's clock is Playwright's, paused, so the 150 ms wait before each check runs only when told."""
    with own_context(page, server.url) as own:
        own.clock.install()
        log_in(own, OPERATOR)
        own.goto(f"/deployments/{server.seed['deployment_id']}/plan/")
        own.wait_for_selector("#check-status.ok")
        own.clock.pause_at(datetime.now() + timedelta(seconds=5))
        held = []
        own.route("**/api/v1/plans/validate/", lambda route: held.append(route))
        replica = own.locator("table.replica-table").filter(has=own.locator("tbody tr:nth-child(2)")).first
        boundary, last_end = replica.locator("input.end").first, replica.locator("input.end").last
        with own.expect_request("**/api/v1/plans/validate/"):
            _set(boundary, str(int(boundary.input_value()) + 1))  # edit A: valid
            own.clock.run_for(200)
        _set(last_end, "30")  # edit B: layers missing; its check waits for the clock
        with own.expect_response("**/api/v1/plans/validate/") as answer:
            held.pop().continue_()
        assert answer.value.json()["valid"]
        time.sleep(0.5)  # the page reads the answer and, where it takes it, renders it
        assert own.locator("#check-status").inner_text() == "checking…"
        assert own.locator("#apply").is_disabled()
        own.unroute("**/api/v1/plans/validate/")
        own.clock.run_for(200)
        own.wait_for_selector("#problems li[data-code=layer_missing]")
        assert own.locator("#apply").is_disabled()


@pytest.fixture(scope="module")
def group_deployment(server) -> int:
    """The module's server with a stopped deployment whose applied plan holds a tensor-parallel group
    (``seed.GROUP_STAGE``). It has no stage rows: the topology and pipelines stay the other tests'."""
    script = "from tests.dashboard.seed import stopped_group_deployment_create as c; print(f'ID={c()}')"
    out = subprocess.run(manage_argv("shell", "-c", script), env=server.env, cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout
    return int(out.split("ID=", 1)[1])


def test_plan_editor_shows_a_groups_shares_and_checks_an_edit_of_them(page, group_deployment):
    page.goto(f"/deployments/{group_deployment}/plan/")
    page.wait_for_selector("#check-status.ok")
    shares = page.locator("tr.shares[data-replica='0'][data-stage='0']")
    ranks = shares.locator("tr[data-rank]")

    def column(selector: str) -> list[str]:
        return [ranks.nth(i).locator(selector).input_value() for i in range(ranks.count())]

    assert column("select.rank-device") == ["node-a/gpu2", "node-a/gpu3"]
    assert column("input.kv-heads") == ["4", "4"] and column("input.columns") == ["7168", "7168"]
    assert column("select.rank-bits") == ["16", "16"]
    assert shares.locator(".group-sums").inner_text() == (
        "kv heads 8 of 8 · MLP columns 14336 of 14336 (a rank at int4 holds whole groups of 32)")
    figures = shares.locator(".group-figures")
    figures.filter(has_text="group link nvlink").wait_for()
    even = _step_ms(figures.inner_text())

    # A head taken from rank 1 alone: the sums no longer add up, and the check says which.
    _set(ranks.nth(1).locator("input.kv-heads"), "3")
    problem = page.locator("#problems li[data-code=bad_group]")
    problem.wait_for()
    assert "the ranks' kv heads sum to 7, the model has 8 (4+3)" in problem.inner_text()
    assert page.locator("#check-status.error").is_visible() and page.locator("#apply").is_disabled()
    assert figures.inner_text() == "not priced until the plan's problems are fixed"
    shot(page, "plan-editor-group-invalid", full_page=False)

    # Rank 0 takes that head: valid, and priced with the uneven shares (its slower rank sets the step).
    _set(ranks.nth(0).locator("input.kv-heads"), "5")
    page.wait_for_selector("#check-status.ok")
    figures.filter(has_text="group link").wait_for()
    assert _step_ms(figures.inner_text()) > even
    edited_rate = page.locator("#figures tr[data-figure=decode_tokens_per_s] td").nth(2)
    assert edited_rate.get_attribute("class") == "worse"
    shot(page, "plan-editor-group", full_page=False)

    # A third rank from the node's spare cards: it takes half the heads and columns of the largest ranks.
    page.locator("button.add-rank").first.click()
    page.wait_for_selector("#check-status.ok")
    assert ranks.count() == 3 and column("input.kv-heads") == ["3", "3", "2"]
    ranks.nth(2).locator("button.remove-rank").click()
    page.wait_for_selector("#check-status.ok")
    assert column("input.kv-heads") == ["5", "3"]


def _set(field, value: str) -> None:
    field.fill(value)
    field.dispatch_event("change")


def _step_ms(text: str) -> float:
    """The step of 'predicted step 1.234 ms (compute …) · group link …'."""
    return float(re.match(r"predicted step ([\d.]+) ms", text).group(1))


def _pipelines(server) -> int:
    return len({s["replica"] for s in server.seed["stages"]})  # StageStatus.replica: the pipeline index


def test_a_kept_trace_is_drawn_as_a_waterfall_from_the_deployments_page(page, server):
    """A stage's export (the seeded pipeline's token) reaches the server's receiver; the Request traces
    page, a link of the Deployments page, lists the trace and draws a bar per span, each under its parent."""
    sample = request_trace()
    body = encode_spans(sample.gateway + sample.stage).SerializeToString()
    authorization = sink_authorization(f"d{server.seed['deployment_id']}-r0", "token-0")
    answer = httpx.post(f"{server.url}/api/v1/traces/otlp/", content=body, headers={
        "Authorization": authorization, "Content-Type": "application/x-protobuf"})
    assert answer.status_code == 200, answer.text
    page.goto("/deployments/")
    page.click("text=Request traces")
    # Generous waits: on a busy machine, plotly (3 MB) loads and parses before the page's module runs.
    page.click(f"#trace-list tr[data-trace='{sample.trace_id}']", timeout=60_000)
    bars = page.locator("#trace-waterfall .barlayer .point")
    bars.nth(3).wait_for(timeout=60_000)
    assert bars.count() == 4
    labels = page.locator("#trace-waterfall .ytick text").all_text_contents()
    assert [label.split(" · ")[0].strip().removeprefix("└ ") for label in labels] == [
        "gateway.request", "gateway.admission", "head.request", "stage.request"]
    assert labels[3] == "\u00a0" * 6 + "└ stage.request · p0/0"  # under the head's span
    assert page.url.endswith(f"?trace={sample.trace_id}")
    detail = page.locator("#span-detail")
    _click_until_detail(page, bars.nth(2), '"motley.prompt_tokens": 5')  # head.request
    _click_until_detail(page, bars.nth(0), '"motley.outcome": "completed"')  # gateway.request
    # The head's first_token mark: a click on an event shows its span, as on a short bar's middle,
    # where plotly reports the mark alone.
    _click_until_detail(page, page.locator("#trace-waterfall .scatterlayer .point").first,
                        '"motley.prompt_tokens": 5')
    expect(detail).to_contain_text('"name": "first_token"')
    shot(page, "traces")


def _click_until_detail(page, target, text: str) -> None:
    """Click ``target`` in the waterfall until the span detail shows ``text``.

    plotly's drag layer takes the click and sends plotly_click for the point its hover found under the
    pointer; the hover runs on a mouse move, throttled, so on a loaded machine a click right after the
    move finds nothing. Move (a pixel off the last try: a real move), wait for the hover's label, then
    click."""
    detail, hover = page.locator("#span-detail"), page.locator("#trace-waterfall .hoverlayer .hovertext")
    for attempt in range(4):
        box = target.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2 + attempt % 2)
        try:
            expect(hover.first).to_be_visible(timeout=5_000)
        except AssertionError:
            continue
        page.mouse.down()
        page.mouse.up()
        try:
            expect(detail).to_contain_text(text, timeout=5_000)  # drawn on the click
            return
        except AssertionError:
            continue
    expect(detail).to_contain_text(text, timeout=1_000)


@pytest.fixture(scope="module")
def degraded_deployment(server) -> int:
    """The module's server with a stopped deployment serving a precision-degraded revision
    (``seed.stopped_degraded_deployment_create``); no stage rows, so the others see nothing new run."""
    script = "from tests.dashboard.seed import stopped_degraded_deployment_create as c; print(f'ID={c()}')"
    return int(manage_shell(server.env, script).split("ID=", 1)[1])


def test_deployments_page_says_what_a_degraded_plan_lowered(page, degraded_deployment):
    """The line the server renders is redrawn from the API on each resync (deployments.js): both say
    what the emergency quality budget lowered."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    with page.expect_response(lambda r: "/api/v1/deployments/?limit=1000" in r.url):
        page.goto("/deployments/")
    line = page.locator(f"section.deployment[data-deployment='{degraded_deployment}'] [data-field=degraded]")
    page.wait_for_load_state("networkidle")  # the resync's redraw done
    expect(line).to_contain_text("Serving a degraded plan: 2 of 4 sequences, context 2048 of 2048 tokens; "
                                 "precision lowered: ")
    expect(line).to_contain_text("of the emergency budget 0.5; the full plan is restored")
    assert not errors, errors
