"""The Nodes page's actions in Debian's chromium against a real server: each button asks first, then
changes the node's intent through the API; dismissing the dialog changes nothing. Screenshot in
test-artifacts/screenshots/nodes.png."""

from __future__ import annotations

import pytest

from tests.dashboard.browser import SCREENSHOTS, SeededServer, logged_in_page
from tests.dashboard.seed import OPERATOR

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = SeededServer(tmp_path_factory.mktemp("var"), "lab_with_deployment")
    try:
        with logged_in_page(server.url, OPERATOR) as page:
            yield page, server.seed
    finally:
        server.stop()


def act(page, node: str, action: str, *, confirm: bool = True) -> None:
    page.locator(f'tr[data-node="{node}"] button[data-action="{action}"]').click()
    dialog = page.locator("#node-confirm")
    dialog.wait_for(state="visible")
    assert page.locator("#node-confirm-title").inner_text() == f"{action.capitalize()} node {node}?"
    if confirm:
        page.locator("#node-confirm-ok").click()
    else:
        page.keyboard.press("Escape")
    dialog.wait_for(state="hidden")


def intent(page, node: str) -> str:
    return page.locator(f'tr[data-node="{node}"]').get_attribute("data-intent")


def test_cordon_uncordon_drain_undrain_from_the_nodes_page(served):
    """node-c carries a stage of the deployment "chat": the drain re-plans it without the node."""
    page, seed = served
    node = "node-c"
    assert node in {stage["node"] for stage in seed["stages"]}  # the drain has a deployment to move
    page.goto("/nodes/")
    assert intent(page, node) == "schedulable"
    act(page, node, "cordon", confirm=False)
    page.wait_for_timeout(500)
    assert intent(page, node) == "schedulable"  # dismissed: nothing sent
    act(page, node, "cordon")
    page.locator(f'tr[data-node="{node}"][data-intent="cordoned"]').wait_for()  # after the reload
    row = page.locator(f'tr[data-node="{node}"]')
    assert row.locator(".intent").inner_text() == "Cordoned"
    assert row.locator(".status").inner_text() == "Ready"
    page.locator("#nodes-table").screenshot(path=str(SCREENSHOTS / "nodes.png"))
    act(page, node, "uncordon")
    page.locator(f'tr[data-node="{node}"][data-intent="schedulable"]').wait_for()
    act(page, node, "drain")
    result = page.locator("#node-action-result")
    result.filter(has_text="node node-c is draining; re-planned: chat").wait_for()
    page.locator(f'tr[data-node="{node}"][data-intent="draining"]').wait_for()
    assert page.locator(f'tr[data-node="{node}"] button').all_inner_texts() == ["Undrain"]
    act(page, node, "undrain")
    page.locator(f'tr[data-node="{node}"][data-intent="schedulable"]').wait_for()
