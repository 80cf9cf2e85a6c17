import json
from pathlib import Path

from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.services import model_register
from tests.api.mixins import APIResourceTests, assert_error

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
NAMES = sorted(p.name for p in MODELS.iterdir())


def config_of(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text())


class TestModelAPI(APIResourceTests):
    url = "/api/v1/models/"
    actions = frozenset({"list", "retrieve", "create", "delete"})

    def make_rows(self, n):
        return [model_register(config=config_of(NAMES[i % len(NAMES)]), name=f"m{LlmModel.objects.count()}")
                for i in range(n)]

    def create_data(self):
        return {"config": config_of("Qwen2.5-7B"), "name": "qwen"}

    def check_created(self, body, data):
        assert (body["name"], body["model_type"], body["total_params"]) == ("qwen", "qwen2", 7_615_616_512)
        assert body["config"] == data["config"] and body["has_weights"] is False and body["path"] == ""

    def update_data(self):
        return {"name": "renamed"}

    def test_register_by_path(self, api):
        response = api.post(self.url, {"path": str(MODELS / "Llama-2-7B")}, format="json")
        assert response.status_code == 201, response.content
        assert response.json()["name"] == "Llama-2-7B" and response.json()["total_params"] == 6_738_415_616

    def test_refusals_name_the_field(self, api):
        assert_error(api.post(self.url, {"config": {"model_type": "gpt2"}, "name": "g"}, format="json"),
                     400, "config: model_type: 'gpt2' is not supported")
        assert_error(api.post(self.url, {"path": "/nonexistent/model"}, format="json"),
                     400, "path: /nonexistent/model: no such file or directory")
        assert_error(api.post(self.url, {"name": "x"}, format="json"), 400, "give either path or config")
        unnamed = {"config": config_of("Llama-2-7B")}
        assert_error(api.post(self.url, unnamed, format="json"), 400, "name: a name is required")
        assert not LlmModel.objects.exists()

    def test_register_by_path_outside_the_model_directories_is_refused(self, api, settings, tmp_path):
        settings.MOTLEY_MODEL_DIRS = (tmp_path.resolve(),)
        response = api.post(self.url, {"path": str(MODELS / "Llama-2-7B")}, format="json")
        assert_error(response, 400, "outside the model directories")

    def test_list_is_light_and_detail_carries_the_config(self, api):
        model = self.make_rows(1)[0]
        assert "config" not in api.get(self.url).json()["results"][0]
        assert api.get(f"{self.url}{model.pk}/").json()["config"]["model_type"] == model.model_type

    def test_profile(self, api, anonymous):
        model = model_register(config=config_of("Llama-2-7B"), name="llama")
        assert anonymous.get(f"{self.url}{model.pk}/profile/").status_code in (401, 403)
        profile = api.get(f"{self.url}{model.pk}/profile/").json()
        assert profile["total_params"] == 6_738_415_616 and len(profile["layers"]) == 32
        assert profile["layers"][0]["kv_bytes_per_token"] == 2 * 32 * 128 * 2
        assert set(profile["layers"][0]["weight_bytes"]) == {"16", "8", "4"}

    def test_filters(self, api):
        for name in ("Llama-2-7B", "Qwen2.5-7B", "Mistral-7B-v0.1"):
            model_register(config=config_of(name), name=name)

        def names(**params):
            return [item["name"] for item in api.get(self.url, params).json()["results"]]

        assert names(model_type="qwen2") == ["Qwen2.5-7B"]
        assert names(name="7b") == ["Llama-2-7B", "Mistral-7B-v0.1", "Qwen2.5-7B"]
        assert names(num_layers=28) == ["Qwen2.5-7B"]
        assert names(ordering="-total_params") == ["Qwen2.5-7B", "Mistral-7B-v0.1", "Llama-2-7B"]
