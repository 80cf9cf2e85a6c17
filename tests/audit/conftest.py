"""The deployments tests' fleet (four registered one-GPU nodes, a tiny deployable model, a draft
revision) and their recorder of sends, so actions act as in production without a broker."""

from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)
from tests.deployments.conftest import llm, nodes, revision, sent  # noqa: F401  (shared fixtures)
