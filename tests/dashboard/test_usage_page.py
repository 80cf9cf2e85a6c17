"""The Usage page: login required, totals and the chart's series embedded from the stored usage, a plain
user's own keys only, the CSV link, the nav entry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.accounts.usage import usage_record


def embedded(body: str) -> dict:
    return json.loads(body.split('id="usage-data" type="application/json">')[1].split("</script>")[0])


@pytest.fixture
def usage(django_user_model, operator):
    other = django_user_model.objects.create_user("other")
    mine, _ = api_key_create(user=operator, name="mine")
    theirs, _ = api_key_create(user=other, name="theirs")
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    for key, tokens in ((mine, (12, 30)), (theirs, (100, 200))):
        usage_record(api_key_id=key.pk, user_id=key.user_id, model="demo", at=an_hour_ago, requests=2,
                     prompt_tokens=tokens[0], completion_tokens=tokens[1], errors=1)
    usage_record(api_key_id=mine.pk, user_id=operator.pk, model="demo", at=an_hour_ago - timedelta(days=3),
                 requests=1, prompt_tokens=1000)  # before the page's 24 hours
    return {"mine": mine, "theirs": theirs}


def test_the_usage_page_needs_a_login(client, db):
    response = client.get(reverse("dashboard:usage"))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_a_plain_user_sees_their_own_keys_totals_and_series(operator_client, usage,
                                                            django_assert_max_num_queries):
    with django_assert_max_num_queries(6):
        response = operator_client.get(reverse("dashboard:usage"))
    body = response.content.decode()
    assert response.status_code == 200
    assert 'href="/usage/" aria-current="page">Usage</a>' in body
    assert 'src="/static/vendor/plotly.min.js"' in body and "dashboard/usage.js" in body
    assert 'id="csv-link" href="/api/v1/usage/?format=csv' in body
    data = embedded(body)
    assert (data["scope"] == "own"
            and [row["group"] for row in data["totals"]] == [f"mine ({usage['mine'].prefix}…)"])
    assert data["total"] == {"requests": 2, "prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42,
                             "errors": 1, "refused": 0}
    assert ([(row["group"], row["total_tokens"]) for row in data["series"]]
            == [(data["totals"][0]["group"], 42)])
    assert "theirs" not in body and '<td class="num">42</td>' in body


def test_staff_see_every_key(client, usage, operator):
    operator.is_staff = True
    operator.save()
    client.force_login(operator)
    data = embedded(client.get(reverse("dashboard:usage")).content.decode())
    assert data["scope"] == "all" and data["total"]["total_tokens"] == 342 and len(data["totals"]) == 2
