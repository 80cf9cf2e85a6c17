"""A Hugging Face ``tokenizer.json`` (and ``tokenizer_config.json``) from a GGUF file's tokenizer metadata.

GGUF carries the vocabulary, not a tokenizer program: ``tokenizer.ggml.model`` says which algorithm
(``gpt2``: byte-level BPE with merges; ``llama``: SentencePiece BPE with scores and byte fallback) and
``tokenizer.ggml.pre`` which pre-tokenizer llama.cpp applies. The ``tokenizers`` package builds the
rest, the same pieces transformers' GGUF loader assembles (transformers/integrations/ggml.py), with
three differences where the file says more than transformers reads: the pre-tokenizer follows
``tokenizer.ggml.pre`` (Llama 3's and SmolLM's splits, not always GPT-2's), every token the file
marks as control (and the unknown token) is special, and BOS/EOS are added as ``add_bos_token`` /
``add_eos_token`` say (transformers' LLaMA tokenizer adds BOS whatever the file says).

Standard library, ``tokenizers`` only: no Django, no torch, no transformers. Raises ``ValueError``
naming the metadata field at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

# llama.cpp's token types (gguf.TokenType): 2 unknown, 3 control, 4 user defined, 6 byte.
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4

# Pre-tokenizer splits by tokenizer.ggml.pre (llama.cpp's llama-vocab.cpp); others get GPT-2's regex.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
SPLITS = {"llama-bpe": LLAMA3_SPLIT, "llama3": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT}

# Tokens that end a turn (llama.cpp's end-of-generation list), recorded as stop tokens when present.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>")


def build_tokenizer(fields: Mapping[str, Any], architecture: str) -> Tokenizer:
    """The tokenizer the file describes; ``fields`` maps GGUF keys to their values."""
    tokens = fields.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("tokenizer.ggml.tokens: the file has no vocabulary")
    kind = fields.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(fields, tokens, architecture)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(fields, tokens)
    else:
        raise ValueError(
            f"tokenizer.ggml.model: {kind!r} is not supported (gpt2: byte-level BPE; llama: SentencePiece)"
        )
    types = fields.get("tokenizer.ggml.token_type") or []
    special = [t for t, kind in zip(tokens, types) if kind in (CONTROL, UNKNOWN)]
    user = [t for t, kind in zip(tokens, types) if kind == USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    post = _post_processor(fields, tokens)
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer


def tokenizer_config(fields: Mapping[str, Any], context_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: special tokens by name, BOS/EOS behaviour and the chat template."""
    tokens = fields["tokenizer.ggml.tokens"]
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": _adds(fields, "bos"),
        "add_eos_token": _adds(fields, "eos"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = fields.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(token_id, int) and 0 <= token_id < len(tokens):
            config[f"{role}_token"] = tokens[token_id]
    template = chat_template(fields)
    if template is not None:
        config["chat_template"] = template
    return config


def chat_template(fields: Mapping[str, Any]) -> str | list[dict[str, str]] | None:
    """``tokenizer.chat_template``; with named ones (``tokenizer.chat_template.NAME``), transformers' list."""
    default = fields.get("tokenizer.chat_template")
    prefix = "tokenizer.chat_template."
    named = [{"name": k[len(prefix):], "template": v} for k, v in fields.items() if k.startswith(prefix)]
    if not named:
        return default
    return ([{"name": "default", "template": default}] if default else []) + named


def stop_token_ids(fields: Mapping[str, Any]) -> list[int]:
    """EOS first, then end-of-turn tokens: the file's EOT/EOM ids and the usual end-of-turn texts."""
    tokens = fields["tokenizer.ggml.tokens"]
    types = fields.get("tokenizer.ggml.token_type") or []
    ids = [fields.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    by_text = {t: i for i, t in enumerate(tokens) if t in END_OF_TURN_TOKENS}
    ids += [i for text, i in sorted(by_text.items(), key=lambda item: item[1])
            if not types or types[i] in (CONTROL, USER_DEFINED)]
    result: list[int] = []
    for token_id in ids:
        if isinstance(token_id, int) and 0 <= token_id < len(tokens) and token_id not in result:
            result.append(token_id)
    return result


def _byte_level_bpe(fields: Mapping[str, Any], tokens: list[str], architecture: str) -> Tokenizer:
    merges = fields.get("tokenizer.ggml.merges")
    if not merges:
        raise ValueError("tokenizer.ggml.merges: a gpt2 (byte-level BPE) tokenizer needs merges")
    pre = fields.get("tokenizer.ggml.pre") or ("qwen2" if architecture == "qwen2" else "default")
    tokenizer = Tokenizer(BPE(
        {t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ", 1)) for m in merges],
        ignore_merges=pre in ("llama-bpe", "llama3"),
    ))
    if pre == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    if pre in SPLITS:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre == "smollm":  # SmolLM's own tokenizer splits digits first
            byte_level = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(fields: Mapping[str, Any], tokens: list[str]) -> Tokenizer:
    scores = fields.get("tokenizer.ggml.scores")
    if not scores or len(scores) != len(tokens):
        raise ValueError("tokenizer.ggml.scores: a llama (SentencePiece) tokenizer needs one score per token")
    merges = fields.get("tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges] if merges else _merges_from_scores(tokens, scores)
    unk_id = fields.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    tokenizer = Tokenizer(BPE(
        {t: i for i, t in enumerate(tokens)}, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True,
    ))
    prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
    tokenizer.normalizer = normalizers.Sequence(
        ([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")]
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else [])
    )
    return tokenizer


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges: every split of a piece into two pieces, by the piece's score (highest
    first), ties in vocabulary order; what transformers' GGUF loader derives, in the same order."""
    score = {t: s for t, s in zip(tokens, scores)}
    merges: list[tuple[str, str, float]] = []
    for piece, piece_score in score.items():
        local = [(piece[:i], piece[i:], piece_score) for i in range(1, len(piece))
                 if piece[:i] in score and piece[i:] in score]
        merges += sorted(local, key=lambda m: (score[m[0]], score[m[1]]), reverse=True)
    merges.sort(key=lambda m: m[2], reverse=True)
    return [(left, right) for left, right, _ in merges]


def _adds(fields: Mapping[str, Any], which: str) -> bool:
    """Whether encoding adds BOS/EOS: the file's flag, else llama.cpp's default (BOS for SentencePiece)."""
    flag = fields.get(f"tokenizer.ggml.add_{which}_token")
    if flag is not None:
        return bool(flag)
    return which == "bos" and fields.get("tokenizer.ggml.model") == "llama"


def _post_processor(fields: Mapping[str, Any], tokens: list[str]) -> processors.TemplateProcessing | None:
    ends = []
    for which in ("bos", "eos"):
        token_id = fields.get(f"tokenizer.ggml.{which}_token_id")
        if _adds(fields, which) and isinstance(token_id, int) and 0 <= token_id < len(tokens):
            ends.append((tokens[token_id], token_id))
        else:
            ends.append(None)
    bos, eos = ends
    if bos is None and eos is None:
        return None
    head, tail = ([bos[0]] if bos else []), ([eos[0]] if eos else [])
    return processors.TemplateProcessing(
        single=[*head, "$A", *tail], pair=[*head, "$A", *tail, *head, "$B:1", *tail],
        special_tokens=[end for end in ends if end is not None],
    )
