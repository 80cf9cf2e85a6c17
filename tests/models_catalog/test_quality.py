"""``manage.py profile_quality``: the measurement lands in the catalog, the profile, the API and the page."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from contracts.model_profile import ModelProfile
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.models_catalog.services import model_register
from tests.worker_runtime.test_quality import fragile_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def measured(tmp_path):
    model = model_register(path=fragile_checkpoint(tmp_path / "fragile"))
    out = StringIO()
    call_command("profile_quality", model.name, "--tokens", "256", "--held-tokens", "256", "--window", "128",
                 "--group-size", "128",  # the fragile layer is planted for groups of 128
                 stdout=out)
    model.refresh_from_db()
    return model, out.getvalue()


def test_profile_quality_stores_the_measurement(measured):
    model, out = measured
    assert "most sensitive layer int8 2" in out and "int4 2" in out
    assert set(model.quality["perplexity"]) == {"fp32", "bf16", "int8", "int4"}
    profile = model_profile(model=model)
    assert set(profile.sensitivity) == {8, 4} and len(profile.sensitivity[4]) == model.num_layers
    assert max(range(4), key=profile.sensitivity[4].__getitem__) == 2
    assert ModelProfile.from_dict(profile.to_dict()).sensitivity == profile.sensitivity
    # Registering the same checkpoint again keeps what was measured.
    again = model_register(path=model.path)
    assert model_profile(model=again).sensitivity == profile.sensitivity


def test_the_api_serves_the_quality(measured, api):
    model, _ = measured
    body = api.get(f"/api/v1/models/{model.pk}/quality/").json()
    assert body["layer_kl"]["4"] == model.quality["layer_kl"]["4"]
    assert api.get(f"/api/v1/models/{model.pk}/").json()["quality"]["window"] == 128
    assert "sensitivity" in api.get(f"/api/v1/models/{model.pk}/profile/").json()


def test_a_config_only_model_is_refused(tmp_path):
    directory = fragile_checkpoint(tmp_path / "bare")
    for shard in directory.glob("*.safetensors"):
        shard.unlink()
    model = model_register(path=directory)
    with pytest.raises(CommandError, match="has no weights"):
        call_command("profile_quality", model.name)
    with pytest.raises(CommandError, match="no model named"):
        call_command("profile_quality", "nope")
    assert LlmModel.objects.get(pk=model.pk).quality == {}
