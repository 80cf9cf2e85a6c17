"""Structured outputs on a real two-stage pipeline of the demo model (its tokenizer is a real byte-level
BPE), in one process: every constrained output parses and validates, whatever the schema and seed; an
unconstrained row beside them samples what it samples alone; a request resumed with its output so far
goes on exactly as it would have; the mask is llguidance's own matcher's."""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest
import torch

from contracts.sampling import SamplingParams
from contracts.structured import StructuredConstraint
from controlplane.gateway.openai.tokenization import ModelTokenizer
from tests.gateway.conftest import DEMO_ARGS
from worker_runtime.make_demo_model import parse_args, write_demo_model
from worker_runtime.scheduler import Request
from worker_runtime.structured import Grammars

from .in_process import InProcessPipeline

NUM_LAYERS = int(DEMO_ARGS[DEMO_ARGS.index("--layers") + 1])
STRICT = {"additionalProperties": False}
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["name", "age"], **STRICT},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "required": ["color", "ok"], **STRICT,
     "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}}},
    {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 2,
                                               "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}}},
     "required": ["tags"], **STRICT},
    {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5}, {"type": "null"}]},
    {"type": "object", "required": ["p"], **STRICT, "properties": {"p": {
        "type": "object", "required": ["x"], **STRICT,
        "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}}}},
]
REGEX = r"[a-c]{2,4}-[0-9]{1,2}"
CHOICES = ["alpha", "beta", "gamma delta"]
LARK = ('start: "call " NAME " " args\nNAME: /[a-z]{1,5}/\nargs: %json {"type": "array", '
        '"items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 2}')
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("structured") / "demo"
    write_demo_model(parse_args([str(out), *DEMO_ARGS]))
    return out


@pytest.fixture(scope="module")
def pipeline(model):
    return InProcessPipeline(model, NUM_LAYERS, 2)


@pytest.fixture(scope="module")
def tokenizer(model):
    return ModelTokenizer.load(model)


def job(tokenizer, constraint: StructuredConstraint | None, *, seed: int | None = None,
        temperature: float = 1.0, prompt: list[int] | None = None, max_tokens: int = MAX_TOKENS):
    params = SamplingParams(temperature=temperature, seed=seed, constraint=constraint)
    return (prompt or tokenizer.encode_prompt("Answer in JSON:"), max_tokens,
            {"sampling": params.to_header(), "stop_token_ids": list(tokenizer.eos_token_ids)})


def text(tokenizer, tokens: list[int]) -> str:
    return tokenizer.tokenizer.decode(tokens, skip_special_tokens=True)


def test_every_output_matches_its_constraint_and_a_plain_row_beside_them_is_unchanged(pipeline, tokenizer):
    seeds = [None, 1, 2]  # None: greedy (temperature 0)
    constraints = [StructuredConstraint("json_schema", json.dumps(s)) for s in SCHEMAS] + [
        StructuredConstraint("regex", REGEX), StructuredConstraint("choice", json.dumps(CHOICES)),
        StructuredConstraint("grammar", LARK)]
    jobs = [job(tokenizer, c, seed=seed, temperature=0.0 if seed is None else 1.0)
            for c in constraints for seed in seeds]
    plain = job(tokenizer, None, seed=5, max_tokens=12)
    (alone,) = pipeline.run([plain])
    *outputs, beside = pipeline.run([*jobs, plain])
    assert beside == alone
    for i, tokens in enumerate(outputs):
        constraint, seed = constraints[i // len(seeds)], seeds[i % len(seeds)]
        assert tokens[-1] in tokenizer.eos_token_ids, (constraint, seed, text(tokenizer, tokens))
        out = text(tokenizer, tokens)
        if constraint.kind == "json_schema":
            jsonschema.validate(json.loads(out), json.loads(constraint.spec))
        elif constraint.kind == "regex":
            assert re.fullmatch(REGEX, out), out
        elif constraint.kind == "choice":
            assert out in CHOICES
        else:
            call = re.fullmatch(r"call [a-z]{1,5} (.*)", out, re.DOTALL)
            assert call and all(0 <= n <= 9 for n in json.loads(call.group(1))), out
    assert len({tuple(t) for t in outputs[:len(seeds)]}) > 1  # seeds draw different outputs


def test_a_resumed_request_goes_on_as_it_would_have(pipeline, tokenizer):
    """Resumed as the gateway resumes it (prompt + output so far, ``generated``, the same seed): the rest
    is the uninterrupted run's rest, because the matcher replayed the output so far."""
    constraint = StructuredConstraint("json_schema", json.dumps(SCHEMAS[0]))
    prompt = tokenizer.encode_prompt("Answer in JSON:")
    (whole,) = pipeline.run([job(tokenizer, constraint, seed=9, prompt=prompt)])
    cut = len(whole) // 2
    resumed = StructuredConstraint(constraint.kind, constraint.spec, generated=cut)
    (rest,) = pipeline.run([job(tokenizer, resumed, seed=9, prompt=prompt + whole[:cut],
                                max_tokens=MAX_TOKENS - cut)])
    assert whole[:cut] + rest == whole
    jsonschema.validate(json.loads(text(tokenizer, whole)), SCHEMAS[0])


def test_out_of_tokens_the_output_stops_where_it_was(pipeline, tokenizer):
    """``max_tokens`` before the grammar completes: the output is cut there (finish_reason "length")."""
    constraint = StructuredConstraint("json_schema", json.dumps(SCHEMAS[0]))
    (tokens,) = pipeline.run([job(tokenizer, constraint, seed=3, max_tokens=4)])
    assert len(tokens) == 4 and text(tokenizer, tokens).startswith('{"')


def test_a_constraint_that_does_not_compile_is_refused_at_the_head(pipeline, tokenizer):
    (result,) = pipeline.run([job(tokenizer, StructuredConstraint("regex", "a(b"))])
    assert result == "rejected"


def test_constrained_requests_are_not_speculated_and_send_their_constraint_with_the_prefill_only(tokenizer):
    params = SamplingParams(constraint=StructuredConstraint("regex", "a+"))
    request = Request.from_submit(b"c", "r", {"prompt": [1, 2], "max_tokens": 3,
                                              "sampling": params.to_header()}, 704)
    assert not request.speculate and request.step_params() == params
    request.output.append(5)
    assert request.step_params().constraint is None


def test_the_mask_is_llguidances_own(model, tokenizer):
    """At each step of an output, the tokens the mask leaves are exactly those of an independent
    matcher's bitmask (its bits read one by one), each of which that matcher would consume."""
    grammars = Grammars(model, 704)
    constraint = StructuredConstraint("json_schema", json.dumps(SCHEMAS[2]))
    output = tokenizer.tokenizer.encode('{"color":"blue","ok":true}', add_special_tokens=False).ids
    output.append(tokenizer.eos_token_ids[0])
    reference = llguidance.LLMatcher(grammars.tokenizer, constraint.grammar())
    params = [SamplingParams(constraint=constraint)]
    for token in output:
        logits, rows = grammars.constrain(torch.zeros(1, 704), [7], params, [1], None)
        allowed = set(torch.nonzero(logits[0] == 0).flatten().tolist())
        bitmask = reference.compute_bitmask()
        assert allowed == {t for t in range(704) if bitmask[t // 8] >> (t % 8) & 1}
        ends = set(tokenizer.eos_token_ids)
        assert token in allowed and all(reference.validate_tokens([t]) == 1 for t in allowed - ends)
        grammars.advance(rows, torch.tensor([token]))
        assert reference.consume_token(token)
    assert grammars.matchers[7].is_stopped()
    grammars.free(7)
    assert not grammars.matchers
