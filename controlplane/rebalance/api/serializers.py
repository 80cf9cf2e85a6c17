from __future__ import annotations

from rest_framework import serializers

from controlplane.rebalance.models import RebalanceProposal


class RebalanceProposalSerializer(serializers.ModelSerializer):
    """A proposal with the figures an operator decides on; its plan is the draft revision's."""

    revision_plan = serializers.JSONField(source="revision.plan", read_only=True)
    decided_by = serializers.CharField(source="decided_by.get_username", read_only=True, default=None)

    class Meta:
        model = RebalanceProposal
        fields = [
            "id", "deployment", "base_revision", "revision", "trigger", "reason", "gain",
            "current_tokens_per_s", "proposed_tokens_per_s", "diff", "status", "created", "decided_at",
            "decided_by", "revision_plan",
        ]
