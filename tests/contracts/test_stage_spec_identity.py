"""What a running stage can take in place (``respec_blocker``), and how a report names its spec
(``spec_digest``)."""

from __future__ import annotations

from contracts.stage_spec import respec_blocker, spec_digest

SPEC = {"pipeline_id": "d1-r0", "auth_token": "t", "model_path": "/m", "stage_index": 1, "num_stages": 3,
        "layers": [4, 8], "listen": "tcp://10.0.0.2:7001", "head": "tcp://10.0.0.1:7000",
        "next": "tcp://10.0.0.3:7002", "bits": 16, "device": "cpu", "threads": 1, "kv_tokens": 512}


def test_layers_precision_kv_and_neighbours_change_in_place():
    wanted = {**SPEC, "layers": [3, 8], "bits": 4, "kv_tokens": 256, "next": "tcp://10.0.0.4:7003",
              "head": "tcp://10.0.0.5:7000", "num_stages": 4}
    assert respec_blocker(SPEC, wanted) is None


def test_another_place_address_device_or_pipeline_needs_a_new_process():
    assert respec_blocker(SPEC, {**SPEC, "listen": "tcp://10.0.0.2:7009"}) == "listen changed"
    assert respec_blocker(SPEC, {**SPEC, "stage_index": 2, "device": "cuda:0"}) == (
        "stage_index, device changed")
    assert respec_blocker(SPEC, {**SPEC, "pipeline_id": "d1-r1", "auth_token": "u"}) == (
        "pipeline_id, auth_token changed")


def test_a_digest_names_the_content_whatever_the_key_order():
    assert spec_digest(SPEC) == spec_digest(dict(reversed(list(SPEC.items()))))
    assert spec_digest(SPEC) != spec_digest({**SPEC, "kv_tokens": 513})
    assert len(spec_digest(SPEC)) == 16
