import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from contracts.model_config import ModelConfig
from contracts.profiler import profile_model
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.models_catalog.services import model_register

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
LLAMA = json.loads((MODELS / "Llama-2-7B" / "config.json").read_text())
pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A Hugging Face-style directory: config, a (fake) safetensors shard and a tokenizer."""
    directory = tmp_path / "Mistral-7B-v0.1"
    directory.mkdir()
    shutil.copy(MODELS / "Mistral-7B-v0.1" / "config.json", directory)
    (directory / "model-00001-of-00002.safetensors").write_bytes(b"")
    (directory / "tokenizer.json").write_text("{}")
    return directory


def test_register_a_checkpoint_directory(checkpoint):
    model = model_register(path=checkpoint)
    assert (model.name, model.path, model.model_type) == ("Mistral-7B-v0.1", str(checkpoint), "mistral")
    assert model.has_weights and model.has_tokenizer
    assert (model.num_layers, model.hidden_size, model.total_params) == (32, 4096, 7_241_732_096)
    assert model.config == json.loads((checkpoint / "config.json").read_text())
    expected = profile_model(ModelConfig.from_file(checkpoint), "Mistral-7B-v0.1")
    assert model_profile(model=LlmModel.objects.get(pk=model.pk)) == expected


def test_a_bare_config_is_for_planning_only():
    model = model_register(path=MODELS / "Llama-3-8B" / "config.json", name="llama3")
    assert (model.name, model.has_weights, model.has_tokenizer) == ("llama3", False, False)
    assert model.path.endswith("Llama-3-8B/config.json") and model.total_params == 8_030_261_248


def test_registering_the_same_path_again_refreshes_it(checkpoint):
    first = model_register(path=checkpoint)
    (checkpoint / "tokenizer.json").unlink()
    again = model_register(path=checkpoint)
    assert again.pk == first.pk and not again.has_tokenizer and LlmModel.objects.count() == 1


def test_name_clashes_are_refused(checkpoint):
    model_register(path=checkpoint, name="m")
    with pytest.raises(ValidationError) as error:
        model_register(path=MODELS / "Llama-2-7B", name="m")
    assert "a model named 'm' is already registered" in error.value.message_dict["name"][0]
    with pytest.raises(ValidationError):
        model_register(config={"model_type": "llama"}, name="m")
    assert LlmModel.objects.get().path == str(checkpoint)


@pytest.mark.parametrize(
    "config, field",
    [
        ({"model_type": "gpt2"}, "model_type: 'gpt2' is not supported"),
        ({**LLAMA, "hidden_act": "gelu"}, "hidden_act: 'gelu' is not supported"),
        ({**LLAMA, "num_hidden_layers": 0}, "num_hidden_layers: expected a positive integer"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(config, field):
    with pytest.raises(ValidationError) as error:
        model_register(config=config, name="x")
    assert field in error.value.message_dict["config"][0]
    assert not LlmModel.objects.exists()


def test_bad_paths(tmp_path):
    with pytest.raises(ValidationError, match="no config.json in this directory"):
        model_register(path=tmp_path)
    with pytest.raises(ValidationError, match="no such file or directory"):
        model_register(path=tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValidationError, match="not a readable JSON file"):
        model_register(path=tmp_path)
    with pytest.raises(ValidationError, match="either path"):
        model_register()
    with pytest.raises(ValidationError, match="a name is required"):
        model_register(config={"model_type": "llama"})


def test_register_model_command(checkpoint):
    out = StringIO()
    call_command("register_model", str(checkpoint), "--name", "mistral", stdout=out)
    assert "model mistral" in out.getvalue() and "7.24B parameters; weights present" in out.getvalue()
    call_command("register_model", str(MODELS / "Qwen2.5-7B"), stdout=out)
    assert "Qwen2.5-7B" in out.getvalue() and "config only" in out.getvalue()
    bad = checkpoint.parent / "gpt2"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(CommandError, match="config: model_type: 'gpt2' is not supported"):
        call_command("register_model", str(bad))


def test_a_path_outside_the_model_directories_is_refused_before_reading_it(checkpoint, tmp_path, settings):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    settings.MOTLEY_MODEL_DIRS = (allowed.resolve(),)
    with pytest.raises(ValidationError, match="outside the model directories"):
        model_register(path=checkpoint)
    (allowed / "escape").symlink_to(checkpoint)  # a link inside that points outside does not count
    with pytest.raises(ValidationError, match="outside the model directories"):
        model_register(path=allowed / "escape")
    with pytest.raises(ValidationError, match="outside the model directories"):
        model_register(path=allowed / ".." / checkpoint.name)
    inside = shutil.copytree(checkpoint, allowed / "Mistral-7B-v0.1")
    assert model_register(path=inside).path == str(inside.resolve())
    assert not LlmModel.objects.filter(path=str(checkpoint)).exists()
