"""A served model's tokenizer and chat template, read from its checkpoint directory.

Tokenizing in the gateway keeps the workers pure tensor programs: they see token ids only.
The chat template is the Jinja2 template of ``tokenizer_config.json`` (as ``transformers`` renders
it: its ``tojson`` filter and ``strftime_now``, ``tools`` passed as given or None), run in Jinja2's
sandbox since a checkpoint is untrusted input. Generation stops on every end token the checkpoint
declares (contracts/end_tokens.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache, lru_cache
from pathlib import Path

from jinja2 import Environment, Template
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from contracts.end_tokens import config_eos_ids, end_token_ids, read_json, token_text

# ChatML, the template transformers used when a tokenizer had none.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """The messages cannot be rendered by the model's template (it raised, or it is broken)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True)
class ModelTokenizer:
    tokenizer: Tokenizer
    chat_template: str
    bos_token: str | None
    eos_token: str | None
    max_context: int
    model_eos_token_ids: tuple[int, ...] = ()  # config.json / generation_config.json's eos_token_id

    @classmethod
    def load(cls, path: str | Path) -> ModelTokenizer:
        return _load(str(Path(path).resolve()))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token that ends generation: the tokenizer's EOS first, then the model's own list."""
        token_id = self.tokenizer.token_to_id(self.eos_token) if self.eos_token else None
        return end_token_ids(token_id, self.model_eos_token_ids)

    def encode_prompt(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """A completion prompt, with the special tokens the tokenizer adds (e.g. BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def render_chat(
        self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The chat template's text for the messages (and the tools, None when there are none), as
        transformers' ``apply_chat_template(tokenize=False)`` renders it."""
        try:
            return _compiled(self.chat_template).render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template refused the messages: {exc}") from exc

    def encode_chat(
        self, messages: list[dict], *, add_generation_prompt: bool = True, add_special_tokens: bool = False,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """Render the chat template (it adds BOS itself, as transformers' apply_chat_template does, so
        the tokenizer's own special tokens are not added unless asked)."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' ``tojson``: plain json.dumps, unlike Jinja's own (which sorts keys and escapes
    HTML characters, so a template would render tools and call arguments differently)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@cache
def template_environment() -> Environment:
    """The sandbox chat templates run in, with the filters and globals transformers gives them."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = _strftime_now
    return environment


@lru_cache(maxsize=16)
def _compiled(chat_template: str) -> Template:
    """The template compiled once (milliseconds of the event loop's time per request otherwise: the
    gateway renders it on the loop). A syntax error raises here, each time, as a TemplateError."""
    return template_environment().from_string(chat_template)


@lru_cache(maxsize=16)
def _load(path: str) -> ModelTokenizer:
    directory = Path(path)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    config = read_json(directory / "tokenizer_config.json")
    model_config = read_json(directory / "config.json")
    generation_config = read_json(directory / "generation_config.json")
    max_context = model_config.get("max_position_embeddings") or config.get("model_max_length") or 2048
    template = config.get("chat_template") or DEFAULT_CHAT_TEMPLATE
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = {t["name"]: t["template"] for t in template}.get("default", DEFAULT_CHAT_TEMPLATE)
    return ModelTokenizer(
        tokenizer=tokenizer,
        chat_template=template,
        bos_token=token_text(config.get("bos_token")),
        eos_token=token_text(config.get("eos_token")),
        max_context=int(max_context),
        model_eos_token_ids=config_eos_ids(model_config, generation_config),
    )
