"""StructuredConstraint: what a well-formed one is, its header (and SamplingParams' with it), and the
compile check the gateway and the head run before anything is sampled."""

from __future__ import annotations

import json

import pytest

from contracts.sampling import SamplingParams
from contracts.structured import ConstraintError, StructuredConstraint

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


@pytest.mark.parametrize("constraint", [
    StructuredConstraint("json_object", ""), StructuredConstraint("json_schema", SCHEMA, generated=3),
    StructuredConstraint("regex", "[a-z]{3}"), StructuredConstraint("choice", '["yes", "no"]'),
    StructuredConstraint("grammar", 'start: "x" %json {"type": "integer"}'),
])
def test_a_constraint_crosses_the_header_as_it_was_and_compiles(constraint):
    assert StructuredConstraint.from_header(json.loads(json.dumps(constraint.to_header()))) == constraint
    assert constraint.problem() is None
    params = SamplingParams(temperature=0.5, constraint=constraint)
    assert SamplingParams.from_header(json.loads(json.dumps(params.to_header()))) == params


def test_an_unconstrained_header_is_what_it_always_was():
    assert SamplingParams(seed=3).to_header() == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 3}
    assert "generated" not in StructuredConstraint("regex", "a").to_header()


@pytest.mark.parametrize(("kind", "spec", "generated"), [
    ("yaml", "a", 0), ("json_object", "{}", 0), ("regex", "", 0), ("json_schema", "[1]", 0),
    ("json_schema", "{nope", 0), ("choice", "[]", 0), ("choice", "[1, 2]", 0), ("regex", "a", -1),
    ("regex", "a", True), ("regex", 5, 0),
])
def test_malformed_constraints_are_refused(kind, spec, generated):
    with pytest.raises(ConstraintError):
        StructuredConstraint(kind, spec, generated)


def test_a_header_with_other_keys_is_refused():
    with pytest.raises(ConstraintError):
        StructuredConstraint.from_header({"kind": "regex", "spec": "a", "extra": 1})


@pytest.mark.parametrize(("kind", "spec", "says"), [
    ("regex", "a(b", "unclosed group"), ("json_schema", '{"type": "nope"}', "nope"),
    ("grammar", "start: foo", "foo"),
])
def test_a_grammar_that_does_not_compile_says_why(kind, spec, says):
    assert says in StructuredConstraint(kind, spec).problem()
