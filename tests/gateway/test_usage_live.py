"""Usage against a real pipeline: the official ``openai`` client sends completions, chats and streams
through daphne to a two-stage pipeline of the demo model; the usage the installation stored equals the
sum of the ``usage`` the client was answered with (a live system of this module's own: the stored usage
must be its requests alone)."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.live_server import live_system
from tests.support.processes import embedded_env, manage_shell_json

pytestmark = [pytest.mark.slow]

STORED = """
import json
from django.db.models import Sum
from controlplane.gateway.models import UsageBucket
print("USAGE=" + json.dumps(UsageBucket.objects.aggregate(
    requests=Sum("requests"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"),
    errors=Sum("errors"))))
"""


@pytest.fixture(scope="module")
def live(demo_model, tmp_path_factory):
    with live_system(demo_model, tmp_path_factory.mktemp("live-usage")) as system:
        yield system


def test_stored_usage_equals_what_the_pipeline_served(live):
    client = openai.OpenAI(base_url=live["base_url"], api_key=live["key"], max_retries=0, timeout=60)
    answered = []
    for max_tokens in (5, 17, 30):
        answered.append(client.completions.create(model="demo", prompt="Once upon a time",
                                                  max_tokens=max_tokens, temperature=0).usage)
    answered.append(client.chat.completions.create(model="demo",
                                                   messages=[{"role": "user", "content": "Hello"}],
                                                   max_tokens=12, temperature=0.8, seed=1).usage)
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=9, stream=True, stream_options={"include_usage": True})
    answered.append([chunk for chunk in stream][-1].usage)
    env = embedded_env(live["pipeline"].workdir)
    for _ in range(20):  # the server writes each request's usage just after its response (usage_backlog.py)
        stored = manage_shell_json(env, STORED, "USAGE")
        if stored["requests"] == len(answered):
            break
    assert stored == {"requests": 5, "errors": 0, "prompt": sum(u.prompt_tokens for u in answered),
                      "completion": sum(u.completion_tokens for u in answered)}
    assert stored["completion"] > 0
