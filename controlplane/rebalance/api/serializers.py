from __future__ import annotations

from functools import cached_property

from rest_framework import serializers

from controlplane.common.permissions import is_operator
from controlplane.rebalance.models import RebalanceProposal


class RebalanceProposalSerializer(serializers.ModelSerializer):
    """A proposal with the figures an operator decides on; its plan is the draft revision's.

    ``decided_by`` (who accepted or dismissed it) is shown to operators, who share the decisions; to
    anyone else it is null: an operator's name is the audit trail's to tell (docs/api.md, "Who sees
    what"). The caller is the context's ``request``; without one nobody's name is shown."""

    revision_plan = serializers.JSONField(source="revision.plan", read_only=True)
    decided_by = serializers.CharField(source="decided_by.get_username", read_only=True, default=None)

    class Meta:
        model = RebalanceProposal
        fields = [
            "id", "deployment", "base_revision", "revision", "trigger", "reason", "gain",
            "current_tokens_per_s", "proposed_tokens_per_s", "diff", "forecast", "status", "created",
            "decided_at", "decided_by", "revision_plan",
        ]

    def to_representation(self, proposal: RebalanceProposal) -> dict:
        data = super().to_representation(proposal)
        if not self._caller_is_operator:
            data["decided_by"] = None
        return data

    @cached_property
    def _caller_is_operator(self) -> bool:
        """Asked once per response: a list's items share this serializer."""
        request = self.context.get("request")
        return request is not None and is_operator(request.user)
