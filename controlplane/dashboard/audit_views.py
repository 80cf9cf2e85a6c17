"""The Audit page: who changed what, when and from where, newest first (docs/dashboard.md).

Read-only, like ``GET /api/v1/audit/`` whose filters it shares: the first page is rendered here (so
the page works without scripts), ``audit.js`` refilters and pages through the API. Staff only, as
that API: anyone else signed in gets 403 and no link to it (base.html).
"""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.audit.selectors import audit_entry_list
from controlplane.audit.services import ACTIONS
from controlplane.common.permissions import STAFF_ONLY_MESSAGE

PAGE_SIZE = 100
FILTERS = ("actor", "action", "target_type")


@login_required
@require_GET
def audit(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        return HttpResponseForbidden(STAFF_ONLY_MESSAGE, content_type="text/plain; charset=utf-8")
    filters = {name: request.GET.get(name, "").strip() for name in FILTERS}
    entries = list(audit_entry_list(**{k: v or None for k, v in filters.items()})[: PAGE_SIZE + 1])
    for entry in entries:
        entry.detail_text = json.dumps(entry.detail, sort_keys=True) if entry.detail else ""
    context = {"page": "audit", "entries": entries[:PAGE_SIZE], "more": len(entries) > PAGE_SIZE,
               "filters": filters, "actions": sorted(ACTIONS), "page_size": PAGE_SIZE}
    return render(request, "dashboard/audit.html", context)
