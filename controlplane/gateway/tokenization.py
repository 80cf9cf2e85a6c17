"""A served model's tokenizer and chat template, read from its checkpoint directory.

Tokenizing in the gateway keeps the workers pure tensor programs: they see token ids only.
The chat template is the Jinja2 template of ``tokenizer_config.json`` (as ``transformers`` renders
it), run in Jinja2's sandbox since a checkpoint is untrusted input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# ChatML, the template transformers used when a tokenizer had none.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """The messages cannot be rendered by the model's template (it raised, or it is broken)."""


def _token_text(value: str | dict | None) -> str | None:
    """tokenizer_config.json names special tokens as strings or as AddedToken dicts."""
    return value.get("content") if isinstance(value, dict) else value


def _raise(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True)
class ModelTokenizer:
    tokenizer: Tokenizer
    chat_template: str
    bos_token: str | None
    eos_token: str | None
    max_context: int

    @classmethod
    def load(cls, path: str | Path) -> ModelTokenizer:
        return _load(str(Path(path).resolve()))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        token_id = self.tokenizer.token_to_id(self.eos_token) if self.eos_token else None
        return () if token_id is None else (token_id,)

    def encode_prompt(self, text: str) -> list[int]:
        """A completion prompt, with the special tokens the tokenizer adds (e.g. BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Render the chat template (it adds BOS itself, as transformers' apply_chat_template does)."""
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.globals["raise_exception"] = _raise
        try:
            text = environment.from_string(self.chat_template).render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template refused the messages: {exc}") from exc
        return self.tokenizer.encode(text, add_special_tokens=False).ids


@lru_cache(maxsize=16)
def _load(path: str) -> ModelTokenizer:
    directory = Path(path)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    model_path = directory / "config.json"
    model_config = json.loads(model_path.read_text()) if model_path.exists() else {}
    max_context = model_config.get("max_position_embeddings") or config.get("model_max_length") or 2048
    template = config.get("chat_template") or DEFAULT_CHAT_TEMPLATE
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = {t["name"]: t["template"] for t in template}.get("default", DEFAULT_CHAT_TEMPLATE)
    return ModelTokenizer(
        tokenizer=tokenizer,
        chat_template=template,
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        max_context=int(max_context),
    )
