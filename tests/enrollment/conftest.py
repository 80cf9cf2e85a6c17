from datetime import timedelta

import pytest

from controlplane.enrollment.services import join_token_create
from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)
from tests.deployments.conftest import llm, sent  # noqa: F401  (sent is autouse: nothing reaches a broker)

DEVICE = {
    "model": "T4", "memory_bytes": 16 * 1024**3, "memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0,
    "bf16_tflops": 0.0, "int8_tops": 130.0, "emulated": True,
}


@pytest.fixture
def join_token(db) -> str:
    return join_token_create(ttl=timedelta(hours=1), description="tests").secret


def registration(join_token: str, name: str = "node-a", devices: int = 2) -> dict:
    return {"join_token": join_token, "name": name, "address": "127.0.0.1", "emulated": True,
            "devices": [dict(DEVICE, index=i) for i in range(devices)]}
