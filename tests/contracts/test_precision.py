"""``contracts.precision.Precision``: the flat fields of a spec or a plan's stage as one value."""

from __future__ import annotations

import pytest

from contracts.precision import FULL, Precision
from contracts.stage_spec import StageSpec


def test_a_precision_reads_and_writes_the_flat_fields_of_a_spec_and_a_plan():
    assert Precision.of({"layers": [0, 4]}) == FULL == Precision(16)
    mixed = Precision.of({"bits": 16, "low_bits": "4", "low_from": 2})
    assert mixed == Precision(16, 4, 2) and mixed.is_split
    assert mixed.fields() == {"bits": 16, "low_bits": 4, "low_from": 2}
    assert mixed.split_fields() == {"low_bits": 4, "low_from": 2} and Precision(8).split_fields() == {}
    assert Precision(8).fields() == {"bits": 8, "low_bits": None, "low_from": None}


def test_layer_bits_split_at_low_from_and_refuse_a_bad_split():
    assert Precision(8).layer_bits(2, 5) == (8, 8, 8)
    assert Precision(16, 4, 3).layer_bits(1, 5) == (16, 16, 4, 4)
    for bad in (Precision(16, 4, 1), Precision(16, 4, None), Precision(8, 16, 3), Precision(16, None, 3)):
        assert bad.problem(1, 5)
        with pytest.raises(ValueError, match="strictly inside"):
            bad.layer_bits(1, 5)
    with pytest.raises(ValueError, match="16, 8 or 4"):
        Precision(2).layer_bits(0, 1)


def test_a_stage_spec_carries_its_precision_and_writes_the_same_fields():
    raw = {"pipeline_id": "d1-r0", "auth_token": "t", "model_path": "/m", "stage_index": 0, "num_stages": 1,
           "layers": [0, 4], "listen": "tcp://127.0.0.1:1", "head": "tcp://127.0.0.1:1", "bits": 16,
           "low_bits": 4, "low_from": 2}
    spec = StageSpec.from_dict(raw)
    assert spec.precision == Precision(16, 4, 2)
    assert {k: spec.to_json()[k] for k in ("bits", "low_bits", "low_from")} == spec.precision.fields()
