"""The OpenAI-compatible endpoints: thin async views over protocol, tokenization and samples.

Errors use OpenAI's shape and status codes (errors.py). A streamed response only starts once the
first text is ready, so a refusal from the replica still gets its status code rather than a 200
stream carrying an error; after that, an error arrives as a final ``data: {"error": …}`` event.

Each request passes its key's limits before it is routed (accounting.py, quotas.py: the models it may
use, requests and tokens per minute, its token budget) and is added to the key's usage when it ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from controlplane.gateway.accounts.accounting import RequestAccount, request_admit
from controlplane.gateway.accounts.quotas import model_visible
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.openai.endpoint import authenticate, endpoint, model_route
from controlplane.gateway.openai.errors import OpenAIError, bad_request
from controlplane.gateway.openai.generation import Delta
from controlplane.gateway.openai.logprobs import ChoiceLogprobs, Scored, echoed
from controlplane.gateway.openai.protocol import GenerationRequest, generation_request, parse_body
from controlplane.gateway.openai.request_span import RequestSpan, request_span
from controlplane.gateway.openai.samples import Samples, samples_start
from controlplane.gateway.openai.tokenization import ChatTemplateError
from controlplane.gateway.openai.tools.calling import ChoiceOutput, ToolCalling, tool_calling
from controlplane.gateway.openai.tools.grammar import tool_constraint
from controlplane.gateway.serving.runtime import ModelRoute, gateway


@endpoint("GET")
async def models_view(request: HttpRequest) -> HttpResponse:
    try:
        api_key = await authenticate(request)
    except OpenAIError as exc:
        return exc.response()
    data = [
        {"id": route.served.name, "object": "model", "created": 0, "owned_by": "motley"}
        for route in await gateway().all_routes() if model_visible(api_key, route.served.name)
    ]
    return JsonResponse({"object": "list", "data": data})


async def _prepare(
    request: HttpRequest, span: RequestSpan, *, chat: bool
) -> tuple[GenerationRequest, Samples, RequestAccount, ToolCalling | None]:
    """Authenticate, validate, tokenize, check the key's limits and admit; raises OpenAIError for every
    refusal. A request that passed the limits is accounted for by the RequestAccount returned."""
    api_key = await authenticate(request)
    body = generation_request(parse_body(request.body), chat=chat)
    route = await model_route(api_key, body.model)
    calling = tool_calling(route.tokenizer, body.tools, body.model)
    if calling is not None:  # tool_choice "required" or a named function: a grammar (tools/grammar.py)
        body = replace(body, keep_token_ids=calling.keep_token_ids,
                       constraint=tool_constraint(calling, body.constraint))
    prompt_ids = _prompt_ids(route, body, calling)
    context = route.tokenizer.max_context
    default = gateway_setting("DEFAULT_CHAT_MAX_TOKENS") if chat else 16
    max_tokens = body.max_tokens or max(1, min(default, context - len(prompt_ids)))
    if len(prompt_ids) + max_tokens > context:
        raise bad_request(
            f"this model's context is {context} tokens; the prompt has {len(prompt_ids)} and max_tokens "
            f"asks for {max_tokens} more",
            param="messages" if chat else "prompt", code="context_length_exceeded",
        )
    deadline_s = float(gateway_setting("DEADLINE_S"))
    phase = {"motley.model": body.model, "motley.prompt_tokens": len(prompt_ids),
             "motley.max_tokens": max_tokens}
    with span.child("gateway.admission", **phase):
        account = await request_admit(api_key=api_key, model=body.model, prompt_tokens=len(prompt_ids),
                                      max_tokens=max_tokens, samples=body.n)
    try:
        samples = await samples_start(
            route=route, request=body, prompt_ids=prompt_ids, max_tokens=max_tokens, deadline_s=deadline_s,
            span=span,
        )
    except OpenAIError:  # the router refused it, at once or after a wait: nothing served, an error in usage
        await account.end(prompt_tokens=0, completion_tokens=0, error=True)
        raise
    return body, samples, account, calling


def _prompt_ids(route: ModelRoute, body: GenerationRequest, calling: ToolCalling | None) -> list[int]:
    tokenizer = route.tokenizer
    if body.messages is not None:
        try:
            tools = list(calling.request.tools) if calling else None
            return tokenizer.encode_chat(body.messages, tools=tools)
        except ChatTemplateError as exc:
            raise bad_request(str(exc), param="messages", code="invalid_value") from None
    if isinstance(body.prompt, list):
        vocab = tokenizer.tokenizer.get_vocab_size()
        if max(body.prompt) >= vocab:
            raise bad_request(f"token ids must be below the vocabulary size {vocab}", param="prompt",
                              code="invalid_value")
        return list(body.prompt)
    return tokenizer.encode_prompt(body.prompt)


def _choice(
    index: int, text: str | dict, finish_reason: str | None, *, chat: bool, stream: bool,
    logprobs: dict | None = None,
) -> dict:
    """A completion's choice, or a chat choice whose ``text`` is its message or delta (a dict) or the
    content of one."""
    if not chat:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    key = "delta" if stream else "message"
    message = text if isinstance(text, dict) else {"role": "assistant", "content": text}
    return {"index": index, key: message, "logprobs": logprobs, "finish_reason": finish_reason}


def _scorers(body: GenerationRequest, samples: Samples, *, chat: bool) -> list[ChoiceLogprobs | None]:
    """Each choice's (a streamed completion's ``text_offset`` counts on per choice)."""
    if body.logprobs is None:
        return [None] * body.n
    return [ChoiceLogprobs(samples.route.tokenizer.tokenizer, chat=chat) for _ in range(body.n)]


def _echo(body: GenerationRequest, samples: Samples) -> tuple[str, list[Scored]]:
    """The echoed prompt (completions' ``echo``): its text, and its tokens with their entries (asked
    with the first token, so known once the first delta came)."""
    if not body.echo:
        return "", []
    prompt = body.prompt
    text = prompt if isinstance(prompt, str) else samples.route.tokenizer.tokenizer.decode(prompt)
    return text, echoed(samples.prompt_ids, samples.prompt_logprobs)


def _envelope(body: GenerationRequest, samples: Samples, *, chat: bool, stream: bool) -> dict:
    kind = "chat.completion" if chat else "text_completion"
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{samples.request_id}",
        "object": f"{kind}.chunk" if chat and stream else kind,
        "created": int(time.time()),
        "model": body.model,
    }


def _usage(samples: Samples) -> dict:
    prompt, completion = len(samples.prompt_ids), samples.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _complete(
    body: GenerationRequest, samples: Samples, deltas: AsyncIterator[Delta], calling: ToolCalling | None, *,
    chat: bool,
) -> JsonResponse:
    parts, events = [[] for _ in range(body.n)], [[] for _ in range(body.n)]
    finish_reasons: list[str | None] = [None] * body.n
    async with aclosing(deltas):
        async for delta in deltas:
            parts[delta.index].append(delta.text)
            events[delta.index].extend(delta.events)
            finish_reasons[delta.index] = delta.finish_reason
    echo_text, echo_tokens = _echo(body, samples)
    choices = []
    for index, scorer in enumerate(_scorers(body, samples, chat=chat)):
        logprobs = scorer.of(events[index], echo_tokens) if scorer is not None else None
        text, reason = echo_text + "".join(parts[index]), finish_reasons[index]
        if chat:
            text, reason = ChoiceOutput(calling).message(text, reason)
        choices.append(_choice(index, text, reason, chat=chat, stream=False, logprobs=logprobs))
    return JsonResponse({
        **_envelope(body, samples, chat=chat, stream=False),
        "choices": choices,
        "usage": _usage(samples),
    })


def _event(data: dict) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _stream(
    body: GenerationRequest, samples: Samples, deltas: AsyncIterator[Delta], first: Delta,
    calling: ToolCalling | None, *, chat: bool,
) -> AsyncIterator[bytes]:
    """One chunk per delta, naming its choice; the stream ends once every choice has finished. With
    tools, a chat delta makes the chunks its choice's parser hands out (none while it holds text back;
    the tokens' log-probabilities then go with the next chunk)."""
    envelope = _envelope(body, samples, chat=chat, stream=True)
    scorers = _scorers(body, samples, chat=chat)
    echo_text, echo_tokens = _echo(body, samples)  # with the first delta
    echoes = [(echo_text, echo_tokens) for _ in range(body.n)]  # each choice's first chunk carries it
    outputs = [ChoiceOutput(calling) for _ in range(body.n)]
    held: list[list] = [[] for _ in range(body.n)]  # token events of text held back, per choice
    unfinished = body.n
    async with aclosing(deltas):
        try:
            if chat:
                for index in range(body.n):
                    yield _event({**envelope, "choices": [_choice(index, "", None, chat=True, stream=True)]})
            delta = first
            while True:
                scorer, (echo_text, echo_tokens) = scorers[delta.index], echoes[delta.index]
                chunks = (outputs[delta.index].chunks(delta.text, delta.finish_reason) if chat
                          else [(echo_text + delta.text, delta.finish_reason)])
                held[delta.index].extend(delta.events)
                for n, (text, reason) in enumerate(chunks):
                    events, held[delta.index] = (held[delta.index], []) if n == 0 else ([], [])
                    logprobs = scorer.of(events, echo_tokens) if scorer is not None else None
                    choice = _choice(delta.index, text, reason, chat=chat, stream=True, logprobs=logprobs)
                    yield _event({**envelope, "choices": [choice]})
                echoes[delta.index] = ("", [])
                unfinished -= delta.finish_reason is not None
                if not unfinished:
                    break
                delta = await anext(deltas)
            if body.include_usage:
                yield _event({**envelope, "choices": [], "usage": _usage(samples)})
        except OpenAIError as exc:
            yield _event(exc.body())
    yield b"data: [DONE]\n\n"


async def _respond(request: HttpRequest, *, chat: bool) -> HttpResponse:
    """The response, naming its trace where the request is traced (request_span.py)."""
    span = request_span(request.headers, path=request.path)
    try:
        body, samples, account, calling = await _prepare(request, span, chat=chat)
        deltas = account.track(samples)
        if not body.stream:
            return span.name_trace(await _complete(body, samples, deltas, calling, chat=chat))
        try:
            first = await anext(deltas)
        except BaseException:
            await deltas.aclose()
            raise
    except OpenAIError as exc:
        span.end(f"refused:{exc.status}", 0)
        return span.name_trace(exc.response())
    except BaseException:
        span.end("failed:internal", 0)
        raise
    events = _stream(body, samples, deltas, first, calling, chat=chat)
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return span.name_trace(response)


@endpoint("POST")
async def completions_view(request: HttpRequest) -> HttpResponse:
    return await _respond(request, chat=False)


@endpoint("POST")
async def chat_completions_view(request: HttpRequest) -> HttpResponse:
    return await _respond(request, chat=True)
