"""Settings of the daphne processes of test_daphne.py: the control plane's, its gateway on stand-ins."""

from controlplane.settings import *  # noqa: F403

MOTLEY_GATEWAY = {
    "CLIENT": "tests.gateway.fakes.FakePipelineClient",
    "SERVED_MODELS": "tests.observability.stand_in.served_models",
    "REFRESH_S": 0.2,
    "HEALTH_REFRESH_S": 0.2,
}
