"""What the rebalance policy remembers between passes, and the proposals it makes.

``RebalanceState`` is the policy's own memory of one deployment (the fleet and calibration its
applied revision was priced on, since when a drift or a throttle has lasted, which trigger
occurrences were already decided, the last decision recorded as an event), so that a pass every few
seconds decides each occurrence once and records it once. ``RebalanceProposal`` is a decision an
operator takes (``propose``) or that was taken for them (``auto``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from controlplane.deployments.models import Deployment, PlanRevision


class RebalanceState(models.Model):
    """Written only by ``services.rebalance_evaluate``; reset whenever another revision is applied."""

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, primary_key=True,
                                      related_name="rebalance_state")
    revision = models.ForeignKey(PlanRevision, null=True, on_delete=models.SET_NULL, related_name="+",
                                 help_text="The applied revision the baseline below belongs to.")
    devices = models.JSONField(default=list, help_text="Plannable device names when the baseline was taken.")
    factors = models.JSONField(default=dict, help_text='Calibration factor by "<device>@<bits>" then.')
    drift_since = models.FloatField(null=True, blank=True, help_text="Unix time a drift began; null: none.")
    throttled_since = models.JSONField(default=dict, help_text="Device name -> unix time its throttle began.")
    better_checked_at = models.FloatField(null=True, blank=True)
    handled = models.JSONField(default=list, help_text="Trigger occurrences already decided (newest last).")
    last_decision = models.CharField(max_length=200, blank=True,
                                     help_text="Key of the last decision recorded as an event.")
    demand = models.JSONField(default=dict, help_text="The demand rule's load samples and since when its "
                                                      "condition has lasted (rebalance/demand.py).")


class RebalanceProposal(models.Model):
    """A better plan the policy found: why, what it changes, and what became of it."""

    class Trigger(models.TextChoices):
        FLEET = "fleet", "The fleet changed"
        DRIFT = "drift", "Measured step times drift from the prediction"
        THROTTLED = "throttled", "A device is throttled"
        BETTER_PLAN = "better_plan", "The planner finds a better plan"
        DEMAND = "demand", "Demand puts the targets at risk, or stays low"

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        ACCEPTED = "accepted", "Accepted"  # applied, by an operator or by the auto policy
        DISMISSED = "dismissed", "Dismissed"
        SUPERSEDED = "superseded", "Superseded"  # a newer proposal replaced it
        EXPIRED = "expired", "Expired"  # the deployment's plan changed otherwise: it no longer applies

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="rebalance_proposals")
    base_revision = models.ForeignKey(PlanRevision, null=True, on_delete=models.SET_NULL, related_name="+",
                                      help_text="The applied revision the proposal would replace.")
    revision = models.ForeignKey(PlanRevision, on_delete=models.CASCADE, related_name="+",
                                 help_text="The proposed plan, a draft of source rebalance.")
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    reason = models.TextField()
    gain = models.FloatField(help_text="Predicted throughput proposed / current - 1.")
    current_tokens_per_s = models.FloatField()
    proposed_tokens_per_s = models.FloatField()
    diff = models.JSONField(default=dict, help_text="What changes: stages moved, boundaries, precision.")
    forecast = models.JSONField(default=dict, blank=True, help_text=(
        "A demand proposal's forecast load and the proposed plan's predicted TTFT/TPOT p95 and capacity "
        "against it and the targets; empty for the other triggers."))
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    created = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   help_text="Who accepted or dismissed it; null for the auto policy.")

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [models.UniqueConstraint(fields=["deployment"], condition=Q(status="open"),
                                               name="rebalance_one_open_proposal")]

    def __str__(self) -> str:
        return f"rebalance proposal {self.pk} of {self.deployment_id} ({self.status})"
