"""The server's hot-path JSON (controlplane/common/json_text.py) reads and writes what the standard
library does: the same values back, the same texts refused."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.common import json_text

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_values)
def test_any_json_value_round_trips_as_the_standard_library_reads_it(value):
    text = json_text.dumps(value)
    assert json.loads(text) == json.loads(json.dumps(value))
    assert json_text.loads(text) == json.loads(text)
    assert json_text.loads(json.dumps(value)) == json.loads(json.dumps(value))


def test_texts_only_the_standard_library_reads_are_read_as_it_reads_them():
    heartbeat = '{"devices": [{"power_w": NaN, "clock": Infinity}], "seq": 3}'
    value = json_text.loads(heartbeat)
    assert math.isnan(value["devices"][0]["power_w"]) and value["devices"][0]["clock"] == math.inf
    assert value["seq"] == 3


def test_an_integer_past_64_bits_is_written_whole_and_read_as_a_float():
    assert json_text.dumps(2**70) == str(2**70)
    assert json_text.loads(str(2**70)) == float(2**70)


@pytest.mark.parametrize("text", ["", "{", "[1,]", "{'a': 1}", "nul"])
def test_malformed_text_is_refused_with_value_error(text):
    with pytest.raises(ValueError):
        json_text.loads(text)


def test_written_text_is_compact_with_int_keys_as_strings_and_non_finite_floats_as_null():
    assert json_text.dumps({1: [1.5, "é"], "b": None}) == '{"1":[1.5,"é"],"b":null}'
    assert json.loads(json_text.dumps({"p": math.nan, "q": -math.inf})) == {"p": None, "q": None}
    with pytest.raises(TypeError):
        json_text.dumps({"a": object()})
