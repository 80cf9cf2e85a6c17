"""A prepared in-place handover on the deployments page: the stage started beside the pipeline, held,
is shown as such, not as one being stopped."""

from __future__ import annotations

import re

from django.urls import reverse

from controlplane.deployments.models import DeploymentStage


def stage_cells(body: str, key: str) -> list[str]:
    rows = re.findall(rf'<tr data-stage="{key}"[^>]*>(.*?)</tr>', body, re.S)
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in rows]


def test_a_held_stage_is_shown_held_and_a_retired_one_stopping(operator_client, running_deployment):
    last = running_deployment.stages.order_by("-stage_index").first()
    DeploymentStage.objects.create(deployment=running_deployment, pipeline=last.pipeline,
                                   plan_replica=last.plan_replica, stage_index=last.stage_index, wanted=False,
                                   held=True, node=last.node,
                                   device=last.device, port=last.port + 100, spec={**last.spec, "hold": True})
    body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    cells = stage_cells(body, last.stage_key)
    assert any("(held: joins at the handover)" in cell for cell in cells)
    assert not any("(stopping)" in cell for cell in cells)
    DeploymentStage.objects.filter(held=True).update(held=False)  # a newer plan dropped it: retired
    body = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert any("(stopping)" in cell for cell in stage_cells(body, last.stage_key))
