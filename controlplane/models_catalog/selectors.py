"""Reads from the model catalog."""

from controlplane.models_catalog.models import LlmModel
from controlplane.modelspec.profile import ModelProfile


def model_profile(*, model: LlmModel) -> ModelProfile:
    """The stored per-layer profile, as the planner's dataclass."""
    return ModelProfile.from_dict(model.profile)
