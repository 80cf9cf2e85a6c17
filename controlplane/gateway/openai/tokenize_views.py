"""vLLM's ``POST /tokenize`` and ``POST /detokenize``, for clients that count tokens before they send.

They take the same API keys and answer the same errors as ``/v1/`` (endpoint.py): 401 without a key,
400 naming the field, 403 for a model the key may not use, 404 for a name the catalog does not know.
They tokenize as the generation endpoints do (tokenization.py), so a count taken here is the count a
request is billed and checked against the context by; they use no replica and no key limits.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from controlplane.gateway.openai.endpoint import authenticate, endpoint, model_route
from controlplane.gateway.openai.errors import OpenAIError, bad_request
from controlplane.gateway.openai.protocol import detokenize_request, parse_body, tokenize_request
from controlplane.gateway.openai.tokenization import ChatTemplateError


@endpoint("POST")
async def tokenize_view(request: HttpRequest) -> HttpResponse:
    """``{"count", "max_model_len", "tokens", "token_strs"}`` (the last null unless asked)."""
    try:
        api_key = await authenticate(request)
        body = tokenize_request(parse_body(request.body))
        tokenizer = (await model_route(api_key, body.model)).tokenizer
        if body.messages is not None:
            try:
                ids = tokenizer.encode_chat(body.messages, add_generation_prompt=body.add_generation_prompt,
                                            add_special_tokens=body.add_special_tokens)
            except ChatTemplateError as exc:
                raise bad_request(str(exc), param="messages", code="invalid_value") from None
        else:
            ids = tokenizer.encode_prompt(body.prompt, add_special_tokens=body.add_special_tokens)
    except OpenAIError as exc:
        return exc.response()
    strs = [tokenizer.tokenizer.id_to_token(i) for i in ids] if body.return_token_strs else None
    return JsonResponse({"count": len(ids), "max_model_len": tokenizer.max_context, "tokens": ids,
                         "token_strs": strs})


@endpoint("POST")
async def detokenize_view(request: HttpRequest) -> HttpResponse:
    """``{"prompt"}``: the ids decoded with their special tokens, as transformers' ``decode`` does."""
    try:
        api_key = await authenticate(request)
        model, ids = detokenize_request(parse_body(request.body))
        tokenizer = (await model_route(api_key, model)).tokenizer.tokenizer
        vocab = tokenizer.get_vocab_size()
        if ids and max(ids) >= vocab:
            raise bad_request(f"token ids must be below the vocabulary size {vocab}", param="tokens",
                              code="invalid_value")
    except OpenAIError as exc:
        return exc.response()
    return JsonResponse({"prompt": tokenizer.decode(ids, skip_special_tokens=False)})
