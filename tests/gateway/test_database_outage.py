"""The gateway through an outage of the control plane's database (a PostgreSQL restart, a failover):
requests of keys read active before it are served on the served models read last, their usage is
kept and written once the database answers again; a key never read before, or one past
``KEY_GRACE_S``, gets a 503 in OpenAI's shape with ``Retry-After``, never Django's HTML 500.

Found by benchmarks/chaos_bench.py's PostgreSQL restart: 6 of 21 requests failed with an HTML 500
(the key's read) and the usage of 3 served requests was lost (the write failed and was dropped).
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError
from django.test import AsyncClient

from controlplane.gateway.accounts import selectors, usage_backlog
from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.models import UsageBucket
from tests.gateway.fakes import Script
from tests.gateway.test_views import post
from tests.gateway.test_waiting import until, waits  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "demo", "prompt": "x", "max_tokens": 3}
DOWN = OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')


@pytest.fixture
def outage(monkeypatch):
    """``outage(True)``: every read and write of the database the gateway makes raises; False: back."""
    from tests.gateway.fakes import FakePipelineClient

    unreachable = {"on": False}
    read, record = selectors._read, usage_backlog.usage_record

    async def key_read(digest):
        if unreachable["on"]:
            raise DOWN
        return await read(digest)

    def usage_write(**figures):
        if unreachable["on"]:
            raise DOWN
        return record(**figures)

    monkeypatch.setattr(selectors, "_read", key_read)
    monkeypatch.setattr(usage_backlog, "usage_record", usage_write)
    monkeypatch.setattr(usage_backlog, "RETRY_S", 0.05)

    def switch(on: bool) -> None:
        unreachable["on"] = on
        FakePipelineClient.source_error = DOWN if on else None

    yield switch
    switch(False)
    assert usage_backlog.flush()  # nothing left queued for the next test


async def test_keys_read_before_are_served_through_the_outage_and_their_usage_is_written_after(
        fake_pipeline, api_key, outage, django_user_model):
    fake_pipeline({"d1-r0": Script(tokens=[5, 6, 7])})
    assert (await post(AsyncClient(), "/v1/completions", BODY, api_key)).status_code == 200
    stranger = await django_user_model.objects.acreate(username="bob")
    unseen = (await sync_to_async(api_key_create)(user=stranger, name="unseen"))[1]  # never used
    outage(True)
    for _ in range(3):
        response = await post(AsyncClient(), "/v1/completions", BODY, api_key)
        assert response.status_code == 200, response.content
    assert usage_backlog.pending() == 3
    refused = await post(AsyncClient(), "/v1/completions", BODY, unseen)
    assert refused.status_code == 503 and refused["Retry-After"]
    assert refused.json()["error"]["code"] == "service_unavailable"
    assert "database cannot be reached" in refused.json()["error"]["message"]
    outage(False)
    await until(lambda: usage_backlog.pending() == 0, timeout_s=5)
    rows = [row async for row in UsageBucket.objects.all()]
    assert sum(r.requests for r in rows) == 4 and sum(r.completion_tokens for r in rows) == 12


async def test_past_the_grace_a_key_needs_the_database(fake_pipeline, api_key, outage, waits):
    fake_pipeline({"d1-r0": Script(tokens=[5])})
    waits(KEY_GRACE_S=0.0)
    assert (await post(AsyncClient(), "/v1/completions", BODY, api_key)).status_code == 200
    outage(True)
    response = await post(AsyncClient(), "/v1/completions", BODY, api_key)
    assert response.status_code == 503 and response["Content-Type"] == "application/json"
    assert response.json()["error"]["type"] == "server_error" and response["Retry-After"] == "5"
    outage(False)
    assert (await post(AsyncClient(), "/v1/completions", BODY, api_key)).status_code == 200
