"""Registering a GGUF file: ``manage.py register_model FILE.gguf`` and the API's path registration convert
it into MOTLEY_MODEL_IMPORT_DIR/<name>/ and register that directory."""

from __future__ import annotations

import json
import os
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from controlplane.audit.models import AuditEntry
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.services import model_register
from tests.api.mixins import api, assert_error, user  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def import_dir(settings, tmp_path):
    settings.MOTLEY_MODEL_IMPORT_DIR = tmp_path / "models"
    return settings.MOTLEY_MODEL_IMPORT_DIR


def test_a_gguf_file_is_converted_and_registered(tiny_ggufs, import_dir):
    model = model_register(path=tiny_ggufs["qwen2"], name="tiny-qwen")
    assert model.path == str(import_dir / "tiny-qwen")
    assert (model.model_type, model.num_layers, model.torch_dtype) == ("qwen2", 2, "float16")
    assert model.has_weights and model.has_tokenizer
    record = json.loads((import_dir / "tiny-qwen" / "gguf_import.json").read_text())
    assert record["source"] == str(tiny_ggufs["qwen2"]) and record["dtype"] == "float16"
    entry = AuditEntry.objects.get(action="model.registered")
    assert entry.detail["source"] == str(tiny_ggufs["qwen2"]) and entry.detail["path"] == model.path


def test_registering_again_converts_only_when_the_file_or_dtype_changed(tiny_ggufs, import_dir):
    first = model_register(path=tiny_ggufs["llama"])  # named after the file: "llama"
    weights = import_dir / "llama" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = model_register(path=tiny_ggufs["llama"])
    assert again.pk == first.pk and weights.stat().st_mtime_ns == stamp and LlmModel.objects.count() == 1
    stat = tiny_ggufs["llama"].stat()
    os.utime(tiny_ggufs["llama"], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    model_register(path=tiny_ggufs["llama"])
    assert weights.stat().st_mtime_ns != stamp
    assert model_register(path=tiny_ggufs["llama"], dtype="bfloat16").torch_dtype == "bfloat16"


def test_name_clashes_are_refused_before_converting(tiny_ggufs, import_dir):
    model_register(path=tiny_ggufs["llama"], name="m")
    with pytest.raises(ValidationError) as error:
        model_register(path=tiny_ggufs["qwen2"], name="m")
    assert f"a model named 'm' is already registered (from {tiny_ggufs['llama']})" in str(error.value)
    record = json.loads((import_dir / "m" / "gguf_import.json").read_text())
    assert record["source"] == str(tiny_ggufs["llama"])
    model_register(config=json.loads((import_dir / "m" / "config.json").read_text()), name="planned")
    with pytest.raises(ValidationError, match="already registered"):
        model_register(path=tiny_ggufs["qwen2"], name="planned")
    assert not (import_dir / "planned").exists()


def test_refusals(tiny_ggufs, import_dir, settings, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(ValidationError) as error:
        model_register(path=bad)
    assert "truncated or corrupt GGUF file" in error.value.message_dict["path"][0]
    with pytest.raises(ValidationError, match="no such file"):
        model_register(path=tmp_path / "absent.gguf")
    with pytest.raises(ValidationError, match="'int4' is not one of float32, float16, bfloat16"):
        model_register(path=tiny_ggufs["llama"], dtype="int4")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    with pytest.raises(ValidationError, match="only a GGUF file is converted"):
        model_register(path=checkpoint, dtype="float16")
    settings.MOTLEY_MODEL_DIRS = (checkpoint.resolve(),)
    with pytest.raises(ValidationError, match="outside the model directories"):
        model_register(path=tiny_ggufs["llama"])
    assert not LlmModel.objects.exists()
    assert [p.name for p in import_dir.iterdir() if p.name != ".import.lock"] == []


def test_the_command(tiny_ggufs, import_dir):
    out = StringIO()
    call_command("register_model", str(tiny_ggufs["mistral"]), "--name=mis", "--dtype=float32", stdout=out)
    assert "model mis" in out.getvalue() and "mistral, 2 layers" in out.getvalue()
    assert str(import_dir / "mis") in out.getvalue()
    assert LlmModel.objects.get(name="mis").torch_dtype == "float32"
    bad = import_dir.parent / "x.gguf"
    bad.write_bytes(b"not gguf")
    with pytest.raises(CommandError, match=r"path: .*x.gguf: not a GGUF file \(it starts with b'not '"):
        call_command("register_model", str(bad))


def test_the_api(api, tiny_ggufs, import_dir):  # noqa: F811
    data = {"path": str(tiny_ggufs["qwen2"]), "name": "q", "dtype": "bfloat16"}
    response = api.post("/api/v1/models/", data, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["path"], body["torch_dtype"]) == (str(import_dir / "q"), "bfloat16") and body["has_weights"]
    assert body["config"]["eos_token_id"] == [2, 0]  # <|im_end|>, then <|endoftext|>
    bad = import_dir.parent / "cut.gguf"
    bad.write_bytes(tiny_ggufs["qwen2"].read_bytes()[:4000])
    assert_error(api.post("/api/v1/models/", {"path": str(bad)}, format="json"), 400,
                 "path: ", "truncated or corrupt GGUF file (4000 bytes)")
    data = {"path": str(tiny_ggufs["qwen2"]), "dtype": "int8"}
    assert_error(api.post("/api/v1/models/", data, format="json"), 400, "dtype")


def test_smollm2_through_the_command(smollm2_gguf, import_dir):
    out = StringIO()
    call_command("register_model", str(smollm2_gguf), "--name", "SmolLM2-135M-Instruct", stdout=out)
    model = LlmModel.objects.get(name="SmolLM2-135M-Instruct")
    assert (model.model_type, model.num_layers, model.hidden_size) == ("llama", 30, 576)
    assert model.torch_dtype == "float16"
    assert model.has_weights and model.has_tokenizer and model.config["eos_token_id"] == [2, 0]
    assert "0.13B parameters; weights present" in out.getvalue()
