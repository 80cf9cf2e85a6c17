"""Who may change what through the API: every signed-in user reads, operators change, staff audit.

Placement is an operator's decision (deployments, plans applied, nodes cordoned or drained, proposals
accepted, devices throttled, the inventory edited), so a plain account is read-only by default; it is
the API's default permission (settings.REST_FRAMEWORK), and a view that lets plain users write (their
own API keys, what-if planning) says so with ``IsAuthenticated``. Operators are staff, or members of
the ``operators`` group (created by the migration of this app; add users to it in the admin).

What names people, their keys and where they came from (the audit trail) is for staff alone
(``StaffOnly``): an operator changes the fleet, an administrator answers for its accounts.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

OPERATORS_GROUP = "operators"
STAFF_ONLY_MESSAGE = "this names users, their API keys and the addresses they came from: staff only"


def is_operator(user) -> bool:
    """Whether ``user`` may change the fleet and its deployments: staff, or in the operators group."""
    if not (user and user.is_authenticated and user.is_active):
        return False
    return user.is_staff or user.groups.filter(name=OPERATORS_GROUP).exists()


class ReadOnlyUnlessOperator(BasePermission):
    """Safe methods for any signed-in user; anything else for operators only (403 naming the group)."""

    message = (f"this changes the fleet or its deployments, which needs an operator: staff, or a member "
               f"of the '{OPERATORS_GROUP}' group")

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or is_operator(request.user)


class StaffOnly(BasePermission):
    """Staff only, whatever the method: what names users, their API keys and their addresses."""

    message = STAFF_ONLY_MESSAGE

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)
