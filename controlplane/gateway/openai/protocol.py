"""The request bodies of /v1/completions and /v1/chat/completions, checked field by field.

Every rule answers a 400 naming the field (``param``), so a client sees what to fix. Fields OpenAI
defines that motley cannot honour (best_of, suffix, completions' tools) are refused rather than ignored.
Chat's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and the tool parts of messages: tools/request.py.
``n``: the
samples of the prompt (1 to ``MAX_SAMPLES``; samples.py serves them).
Log-probabilities: chat's ``logprobs`` (a boolean) and ``top_logprobs`` (0-20, with ``logprobs``);
completions' ``logprobs`` (0-5 alternatives, OpenAI's legacy limit) and ``echo``.
Structured outputs: ``response_format`` and vLLM's ``structured_outputs`` (structured.py).
One extension of motley's own: ``speculate`` (a boolean, default true; false: this request does not
speculate where its deployment does, docs/gateway.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from contracts.sampling import MAX_LOGPROBS
from contracts.structured import StructuredConstraint
from controlplane.gateway.openai.errors import bad_request
from controlplane.gateway.openai.structured import structured_constraint
from controlplane.gateway.openai.tools.request import ToolRequest, message_tool_fields, tool_request

MAX_STOPS = 4
MAX_SAMPLES = 16  # n, at most: n samples hold n sequences' KV on one replica
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's legacy completions limit (chat's top_logprobs: MAX_LOGPROBS)
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(frozen=True)
class GenerationRequest:
    model: str
    prompt: str | list[int] | None  # /v1/completions
    messages: list[dict[str, Any]] | None  # /v1/chat/completions (contents as text, tool fields kept)
    max_tokens: int | None  # None: the endpoint's default
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    speculate: bool = True  # false: no proposals for this request where the deployment speculates
    logprobs: int | None = None  # alternatives per token; None: no log-probabilities asked
    echo: bool = False  # completions: the prompt before the completion (with logprobs: the prompt's too)
    n: int = 1  # samples of the prompt, each a choice
    tools: ToolRequest | None = None  # chat: the tools offered, and tool_choice
    keep_token_ids: tuple[int, ...] = ()  # special tokens whose text the output keeps (tool-call markers)
    constraint: StructuredConstraint | None = None  # what the output must match (structured.py)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(
    body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad_request(f"'{name}' must be a number", param=name, code="invalid_type")
    if value > high or value < low or (low_open and value == low):
        bounds = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise bad_request(f"'{name}' must be in {bounds}; got {value}", param=name, code="invalid_value")
    return float(value)


def _optional_int(body: dict, name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise bad_request(f"'{name}' must be an integer", param=name, code="invalid_type")
    if minimum is not None and value < minimum:
        message = f"'{name}' must be at least {minimum}; got {value}"
        raise bad_request(message, param=name, code="invalid_value")
    return value


def _boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", param=name, code="invalid_type")
    return value


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", param="stop", code="invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' takes at most {MAX_STOPS} strings", param="stop", code="invalid_value")
    return tuple(stops)


def _samples(body: dict) -> int:
    n = _optional_int(body, "n", minimum=1)
    if n is not None and n > MAX_SAMPLES:
        raise bad_request(f"'n' must be at most {MAX_SAMPLES}; got {n}", param="n", code="invalid_value")
    return n or 1


def _unsupported(body: dict, *, chat: bool) -> None:
    if body.get("best_of", 1) not in (1, None):
        raise bad_request("best_of is not supported", param="best_of", code="unsupported_value")
    for name in ("suffix",) if chat else ("suffix", "tools", "functions"):
        if body.get(name) not in (None, False):
            raise bad_request(f"'{name}' is not supported", param=name, code="unsupported_parameter")


def _bounded_int(body: dict, name: str, high: int) -> int | None:
    value = _optional_int(body, name, minimum=0)
    if value is not None and value > high:
        raise bad_request(f"'{name}' must be at most {high}; got {value}", param=name, code="invalid_value")
    return value


def _logprobs(body: dict, *, chat: bool) -> tuple[int | None, bool]:
    """The alternatives per token (None: no log-probabilities) and ``echo``, as each endpoint names them."""
    if not chat:
        return _bounded_int(body, "logprobs", MAX_COMPLETION_LOGPROBS), _boolean(body, "echo", False)
    if body.get("echo") not in (None, False):
        raise bad_request("'echo' is not supported", param="echo", code="unsupported_parameter")
    top = _bounded_int(body, "top_logprobs", MAX_LOGPROBS)
    if not _boolean(body, "logprobs", False):
        if top is not None:
            raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs",
                              code="invalid_value")
        return None, False
    return top or 0, False


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", param="prompt", code="invalid_value")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return prompt
    raise bad_request(
        "'prompt' must be a non-empty string or a list of token ids (one prompt per request)",
        param="prompt", code="invalid_type",
    )


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise bad_request(
        f"messages[{index}].content must be a string or a list of text parts",
        param=f"messages[{index}].content", code="invalid_type",
    )


def _messages(body: dict) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", param="messages", code="invalid_type")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise bad_request(
                f"messages[{i}] must be an object with a role in {sorted(CHAT_ROLES)}",
                param=f"messages[{i}].role", code="invalid_value",
            )
        tool_fields = message_tool_fields(message, i)
        content = message.get("content")
        if content is not None or "tool_calls" not in tool_fields:  # a call's content may be null
            content = _content_text(content, i)
        out.append({"role": message["role"], "content": content, **tool_fields})
    return out


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return body


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string", param="model", code="invalid_type")
    return model


def generation_request(body: dict, *, chat: bool) -> GenerationRequest:
    """Validate a completions (``chat=False``) or chat-completions body; raises OpenAIError (400)."""
    model = _model(body)
    _unsupported(body, chat=chat)
    max_tokens = _optional_int(body, "max_tokens", minimum=1)
    if chat and max_tokens is None:
        max_tokens = _optional_int(body, "max_completion_tokens", minimum=1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream", code="invalid_type")
    logprobs, echo = _logprobs(body, chat=chat)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options", code="invalid_type")
    return GenerationRequest(
        model=model,
        prompt=None if chat else _prompt(body),
        messages=_messages(body) if chat else None,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        seed=_optional_int(body, "seed"),
        stop=_stop(body),
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        speculate=_boolean(body, "speculate", True),
        logprobs=logprobs,
        echo=echo,
        n=_samples(body),
        constraint=structured_constraint(body),
        tools=tool_request(body) if chat else None,
    )



@dataclass(frozen=True)
class TokenizeRequest:
    """vLLM's ``/tokenize`` body: a completion ``prompt`` or chat ``messages`` (then rendered with the
    chat template, as the chat endpoint renders them)."""

    model: str
    prompt: str | None
    messages: list[dict[str, Any]] | None
    add_special_tokens: bool  # default: true for a prompt, false for messages (the template adds BOS)
    add_generation_prompt: bool
    return_token_strs: bool


def tokenize_request(body: dict) -> TokenizeRequest:
    """Validate a ``/tokenize`` body: exactly one of ``prompt`` (a string) and ``messages``."""
    model = _model(body)
    chat = "messages" in body
    if chat == ("prompt" in body):
        raise bad_request("give either 'prompt' or 'messages'", param="prompt", code="invalid_value")
    if not chat and not isinstance(body["prompt"], str):
        raise bad_request("'prompt' must be a string", param="prompt", code="invalid_type")
    return TokenizeRequest(
        model=model,
        prompt=None if chat else body["prompt"],
        messages=_messages(body) if chat else None,
        add_special_tokens=_boolean(body, "add_special_tokens", not chat),
        add_generation_prompt=_boolean(body, "add_generation_prompt", True),
        return_token_strs=_boolean(body, "return_token_strs", False),
    )


def detokenize_request(body: dict) -> tuple[str, list[int]]:
    """Validate a ``/detokenize`` body: its model and its token ids (each checked against the
    vocabulary by the caller, who knows the model's)."""
    model = _model(body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(_is_int(t) and t >= 0 for t in tokens):
        raise bad_request("'tokens' must be a list of token ids", param="tokens", code="invalid_type")
    return model, tokens
