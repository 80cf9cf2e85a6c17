"""In chromium against a real server: the plan editor's Apply of an edited plan is audited as
``plan.edited``, its Rebalance proposal applied unchanged as ``plan.proposal_accepted``, both by the
operator from the browser's session; the operator has no Audit link (not staff), and staff's Audit page
shows both and filters through the API."""

from __future__ import annotations

import re

import pytest

from tests.dashboard.browser import SeededServer, log_in, logged_in_page, own_context
from tests.dashboard.seed import ADMIN, OPERATOR

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = SeededServer(tmp_path_factory.mktemp("var"), "lab_with_auditor")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(server):
    with logged_in_page(server.url, OPERATOR) as page:
        yield page


def apply(page) -> None:
    page.wait_for_selector("#apply:not([disabled])")
    page.click("#apply")
    page.click("#confirm-apply")
    page.wait_for_function("['ok', 'error'].includes(document.getElementById('apply-result').className)")
    result = page.locator("#apply-result")
    assert result.get_attribute("class") == "ok", result.inner_text()
    page.wait_for_url(re.compile(r"/deployments/$"))


def rows(page) -> list[list[str]]:
    return [[cell.strip() for cell in row.locator("td").all_inner_texts()]
            for row in page.locator("#audit-table tbody tr[data-entry]").all()]


def test_editor_applies_are_audited_by_kind_and_shown_on_the_audit_page(page, server):
    editor = f"/deployments/{server.seed['deployment_id']}/plan/"
    page.goto(editor)
    page.wait_for_selector("#check-status.ok")
    # Move the boundary of a plan replica of two stages or more by one layer (its stage 0 takes one more).
    replica = page.locator("table.replica-table").filter(has=page.locator("tbody tr:nth-child(2)")).first
    boundary = replica.locator("input.end").first
    boundary.fill(str(int(boundary.input_value()) + 1))
    boundary.dispatch_event("change")
    page.wait_for_selector("#check-status.ok")
    apply(page)  # an edit

    page.goto(editor)
    page.wait_for_selector("#check-status.ok")
    page.click("#rebalance")
    page.wait_for_function(
        "document.getElementById('proposal').textContent.startsWith('Proposal from the planner')")
    page.wait_for_selector("#check-status.ok")
    apply(page)  # the proposal, unchanged
    assert page.locator("nav >> text=Audit").count() == 0  # the operator is not staff

    with own_context(page, server.url) as staff:
        log_in(staff, ADMIN)
        staff.click("nav >> text=Audit")
        staff.wait_for_url(re.compile(r"/audit/$"))
        actions = [(r[1].split()[0], r[1].split()[-1], r[2], r[4]) for r in rows(staff)]
        assert actions[:2] == [("operator", "session", "plan.proposal_accepted", "127.0.0.1"),
                               ("operator", "session", "plan.edited", "127.0.0.1")]
        assert "deployment chat" in " ".join(rows(staff)[0])

        staff.fill("#audit-filters input[name=action]", "plan.edited")
        staff.click("#audit-filters button[type=submit]")
        staff.wait_for_function(
            "document.querySelectorAll('#audit-table tbody tr[data-entry]').length === 1")
        assert rows(staff)[0][2] == "plan.edited" and staff.url.endswith("?action=plan.edited")
        assert staff.locator("#audit-status").inner_text() == "1 entry"
