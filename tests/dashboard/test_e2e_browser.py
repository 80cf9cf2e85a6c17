"""The operator's whole loop in the browser, on the real system: run_local, three agents with an
emulated fleet and real stage processes (tests/e2e/harness.py). Log in, see the running deployment
on the topology coloured by the agents' telemetry and a chart growing live, make an invalid edit
and see the error, move a layer boundary, apply it, and see the deployment READY on the new plan."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.dashboard.browser import SCREENSHOTS, logged_in_page
from tests.e2e.conftest import demo_model, embedded_system, system_env  # noqa: F401  (fixtures)
from tests.e2e.harness import wait_until
from tests.e2e.test_deploy import deploy
from tests.support.processes import read_credentials

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("playwright.sync_api")


def test_operator_moves_a_boundary_and_the_deployment_is_ready_on_the_new_plan(embedded_system, demo_model):
    system = embedded_system
    pk = deploy(system, demo_model)  # three stages on n0, n1, n2: layers [0, 2), [2, 4), [4, 6)
    system.wait_status(pk, "ready", 120)
    admin = read_credentials(Path(system.env["MOTLEY_VAR_DIR"]))
    credentials = (admin["username"], admin["password"])
    with logged_in_page(system.url, credentials, start="/") as page:
        assert page.locator("g.stage").count() == 3
        # Coloured by the agents' telemetry.
        page.wait_for_function("document.querySelectorAll('g.gpu[data-value]').length === 3")
        page.screenshot(path=str(SCREENSHOTS / "e2e-topology.png"), full_page=True)

        page.goto("/utilization/?")
        page.select_option("#node-filter", "")  # all nodes
        points = "document.getElementById('chart-utilization').data?.[0]?.x?.length || 0"
        page.wait_for_function(f"{points} > 0")
        before = page.evaluate(points)
        page.wait_for_function(f"{points} >= {before + 2}")

        page.goto(f"/deployments/{pk}/plan/")
        page.wait_for_selector("#check-status.ok")
        ends = page.locator("input.end")
        ends.nth(2).fill("5")
        ends.nth(2).dispatch_event("change")
        page.wait_for_selector("#problems li[data-code=layer_missing]")
        assert page.locator("#apply").is_disabled()
        ends.nth(2).fill("6")
        ends.nth(2).dispatch_event("change")
        ends.nth(0).fill("3")  # stage 0 takes layer 2 from stage 1
        ends.nth(0).dispatch_event("change")
        page.wait_for_selector("#apply:not([disabled])")
        page.click("#apply")
        page.click("#confirm-apply")
        page.wait_for_url(re.compile(r"/deployments/$"))

        def ready_on_revision_2():
            d = system.deployment(pk)
            wanted = [s for s in d["stages"] if s["wanted"]]
            # The handover is done when every pipeline serves and no replaced stage is left.
            return d["status"] == "ready" and d["revision_number"] == 2 and all(
                s["state"] == "ready" for s in wanted) and len(wanted) == len(d["stages"]) and all(
                p["phase"] == "serving" for p in d["pipelines"]) and d

        final = wait_until(ready_on_revision_2, 120, "revision 2 ready")
        assert [s["layers"] for s in final["stages"] if s["wanted"]] == [[0, 3], [3, 4], [4, 6]]
        page.reload()
        page.wait_for_selector('section.deployment [data-field=status]:text-is("ready")')
        assert "revision 2 applied (edited by an operator)" in page.content()
        page.screenshot(path=str(SCREENSHOTS / "e2e-deployments.png"), full_page=True)
