"""Reads from the model catalog."""

from contracts.model_profile import ModelProfile
from controlplane.models_catalog.models import LlmModel


def model_profile(*, model: LlmModel) -> ModelProfile:
    """The stored per-layer profile, as the planner's dataclass."""
    return ModelProfile.from_dict(model.profile)
