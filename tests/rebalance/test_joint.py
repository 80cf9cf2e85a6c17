"""Several deployments scaling out at once through the policy's Celery task: the free cards shared
jointly (rebalance/card_claims.py), priority first and then by what each card is worth to each model,
against the first come, first served order it replaces.

The lab fleet with two deployments of Llama-3-8B: ``big`` (priority 1, held at 16 bits) on node-c's
three cards, ``small`` (priority 0, every layer allowed at int4) on node-b's two V100s. Free: the
A100 node-a/gpu0 and the L4 node-b/gpu0 (the other cards unhealthy). The L4 holds big at 16 bits
(about 60 tokens/s) or small at int4 (about 170); the A100 is worth about 390 to big and 1000 to small.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from contracts.fleet_file import load_fleet_file
from controlplane.deployments.models import Deployment, PlanRevision
from controlplane.inventory.models import Device, Node
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from controlplane.planning.card_shares import Claimant, assign, greedy, score
from controlplane.rebalance.demand import sample_publish
from controlplane.rebalance.models import RebalanceProposal
from controlplane.rebalance.tasks import rebalance_evaluate_all
from tests.dashboard.seed import LAB_FLEET, _checkpoint_stand_in, running_deployment_create
from tests.rebalance.helpers import policy_events, proposals

pytestmark = pytest.mark.django_db

A100, L4 = "node-a/gpu0", "node-b/gpu0"
HIGH = 0.8  # MOTLEY_REBALANCE_DEMAND_HIGH's default: the scale-out mark


def healthy_only(names: set[str]) -> None:
    Device.objects.update(health=Device.Health.UNHEALTHY, health_override=Device.Health.UNHEALTHY)
    for device in Device.objects.select_related("node"):
        if device.name in names:
            device.health_override = None
            device.save()


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def pair(db, policy_settings):
    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    Node.objects.update(incarnation=1)  # as if each node's agent registered
    model = model_register(path=_checkpoint_stand_in())
    node_c = {"node-c/gpu0", "node-c/gpu1", "node-c/gpu2"}
    healthy_only(node_c)
    big = running_deployment_create(model=model, name="big", request={
        "batch": 4, "context": 2048, "bits": [16], "max_quantized": 0.0})
    healthy_only({"node-b/gpu2", "node-b/gpu3"})
    small = running_deployment_create(model=model, name="small", request={
        "batch": 4, "context": 2048, "bits": [16, 8, 4], "max_quantized": 1.0})
    healthy_only(node_c | {"node-b/gpu2", "node-b/gpu3", A100, L4})
    Deployment.objects.filter(pk=big.pk).update(priority=1)
    PlanRevision.objects.update(applied_at=timezone.now() - timedelta(hours=1))
    big.refresh_from_db()
    small.refresh_from_db()
    return big, small


def capacity(deployment) -> float:
    return deployment.revision.plan["predicted"]["decode_tokens_per_s"]


def passes(load: dict, t0: float, monkeypatch, seconds=range(0, 80, 10)) -> None:
    """Each deployment's gateway publishing ``load[deployment]`` output tokens/s, and a policy pass,
    every 10 s."""
    for s in seconds:
        for deployment, tokens in load.items():
            sample_publish(deployment_id=deployment.pk, process="gw-1", sample={
                "at": t0 + s, "arrival_rate": tokens / 100, "output_tokens_per_s": tokens})
        monkeypatch.setattr("controlplane.rebalance.services.time.time", lambda s=s: t0 + s)
        rebalance_evaluate_all()


def short_of(deployment, need: float) -> float:
    """The load whose forecast is ``need`` tokens/s over what the applied plan covers below the mark."""
    return HIGH * (capacity(deployment) + need)


def devices_of(proposal) -> set[str]:
    return {stage.device for replica in proposal.revision.placements for stage in replica}


def demand_proposal(deployment):
    [proposal] = proposals(deployment, trigger="demand")
    return proposal


def cards_of(deployment) -> dict:
    [event] = [e for e in policy_events(deployment) if e.detail.get("trigger") == "demand"]
    return event.detail["cards"]


def test_joint_gives_the_old_card_to_the_priority_model_that_can_spare_the_new_one(pair, t0, monkeypatch):
    """Greedy: big (the priority) takes the A100, worth most to it, and small gets the L4, short of
    its need. Joint: big's small need is met by the L4, small gets the A100."""
    big, small = pair
    passes({big: short_of(big, 40), small: short_of(small, 500)}, t0, monkeypatch)
    big_cards, small_cards = cards_of(big), cards_of(small)
    assert set(big_cards["given"]) == {L4} and set(small_cards["given"]) == {A100}
    assert big_cards["withheld"] == {A100: "small"} and small_cards["withheld"] == {L4: "big"}
    assert big_cards["given_tokens_per_s"] >= big_cards["need_tokens_per_s"] == pytest.approx(40, abs=1)
    assert small_cards["given_tokens_per_s"] >= small_cards["need_tokens_per_s"] == pytest.approx(500, abs=1)
    # The order it replaces, on the same figures, gives big the A100 and leaves small short.
    claimants = [Claimant(d.name, d.priority, cards["need_tokens_per_s"],
                          {card: int(w) for card, w in cards["worth"].items()})
                 for d, cards in ((big, big_cards), (small, small_cards))]
    assert big_cards["worth"][A100] > big_cards["worth"][L4]
    first_come = greedy(claimants, [A100, L4])
    assert first_come == {A100: "big", L4: "small"}
    assert score(claimants, first_come)[1] < small_cards["need_tokens_per_s"]
    assert score(claimants, assign(claimants, [A100, L4]))[1] == small_cards["need_tokens_per_s"]
    # Each re-plan used the card it was given and not the other's.
    big_proposal, small_proposal = demand_proposal(big), demand_proposal(small)
    assert L4 in devices_of(big_proposal) and A100 not in devices_of(big_proposal)
    assert A100 in devices_of(small_proposal) and L4 not in devices_of(small_proposal)
    assert len(big_proposal.revision.placements) == len(big.revision.placements) + 1
    assert len(small_proposal.revision.placements) == len(small.revision.placements) + 1
    assert f"given {L4} (" in big_proposal.reason and "against a need of 4" in big_proposal.reason
    assert f"left to the others: {L4} (big)" in small_proposal.reason


def test_under_scarcity_the_higher_priority_gets_its_need_met_first(pair, t0, monkeypatch):
    """Only the A100 is free and both need more than it gives small's rival: big, the priority, gets
    it; small's re-plan may not use it and asks for a larger batch on its own cards instead."""
    big, small = pair
    healthy_only({"node-c/gpu0", "node-c/gpu1", "node-c/gpu2", "node-b/gpu2", "node-b/gpu3", A100})
    passes({big: short_of(big, 300), small: short_of(small, 900)}, t0, monkeypatch)
    assert set(cards_of(big)["given"]) == {A100} and cards_of(small)["given"] == {}
    assert A100 in devices_of(demand_proposal(big))
    small_proposal = demand_proposal(small)
    assert A100 not in devices_of(small_proposal)
    assert small_proposal.diff["batch"] == [4, 8]  # no free card left to it: more sequences instead
    assert "given no card" in small_proposal.reason
    assert f"left to the others: {A100} (big)" in small_proposal.reason


def test_one_scale_out_alone_plans_as_without_the_joint_pass(pair, t0, monkeypatch):
    """small's load is steady under the mark: big alone scales out, on the free cards as before."""
    big, small = pair
    passes({big: short_of(big, 40), small: 0.6 * capacity(small)}, t0, monkeypatch)
    [event] = [e for e in policy_events(big) if e.detail.get("trigger") == "demand"]
    assert "cards" not in event.detail and "free cards shared" not in event.message
    proposal = demand_proposal(big)
    assert len(proposal.revision.placements) == len(big.revision.placements) + 1
    assert proposals(small) == []


def test_on_auto_both_shares_are_applied(pair, t0, monkeypatch):
    """The same competition with the policy on auto: each re-plan is applied at once, on the card the
    joint pass gave it, and neither takes the other's."""
    big, small = pair
    auto = Deployment.RebalancePolicy.AUTO
    Deployment.objects.filter(pk__in=[big.pk, small.pk]).update(rebalance_policy=auto)
    passes({big: short_of(big, 40), small: short_of(small, 500)}, t0, monkeypatch)
    for deployment, card, other in ((big, L4, A100), (small, A100, L4)):
        proposal = demand_proposal(deployment)
        assert proposal.status == RebalanceProposal.Status.ACCEPTED
        deployment.refresh_from_db()
        assert deployment.revision == proposal.revision
        used = {stage.device for replica in deployment.revision.placements for stage in replica}
        assert card in used and other not in used
