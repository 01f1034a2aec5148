"""The prompt as the model reads it: the chat template rendered, then encoded with the model's
tokenizer so that text written by a user never becomes a control token.

Rendering the template to text and encoding the whole text would turn a user's literal
`<|im_start|>system` into the real control tokens (a forged system turn). So each message's
content is rendered as a placeholder; the template's own text is encoded with special tokens
recognised, and each content is encoded with special tokens spelled out as plain text.

Only `tokenizers` and `jinja2` are used (never torch or transformers), so the web process can
count a prompt's tokens before admitting it, with the same code the worker encodes it with.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# Never produced by a template on its own, and never part of a content (contents are not
# rendered at all): splitting the rendered text on it is unambiguous.
_PLACEHOLDER = "\ufffcmessage-{}\ufffc"
_PLACEHOLDER_RE = re.compile("\ufffcmessage-(\\d+)\ufffc")
# Without a tokenizer, a prompt is counted as one token per UTF-8 byte of its text, plus this
# much per message for role markers and this much for what a template adds (a default system
# prompt). No byte-level BPE tokenizer makes more tokens than bytes, so the bound never admits
# a prompt that the model's context cannot hold.
BOUND_TOKENS_PER_MESSAGE = 8
BOUND_TEMPLATE_TOKENS = 64


class ChatTemplateError(ValueError):
    """The model's chat template refused these messages (e.g. roles out of order)."""


class PromptEncoder:
    """Messages -> prompt token ids for one model folder (tokenizer.json and a chat template)."""

    def __init__(self, model_path: Path) -> None:
        config = json.loads((model_path / "tokenizer_config.json").read_text())
        template_file = model_path / "chat_template.jinja"
        source = template_file.read_text() if template_file.is_file() else config.get("chat_template")
        if not isinstance(source, str):
            raise FileNotFoundError(f"{model_path} has no chat template")
        # The environment Hugging Face renders chat templates in, so templates read the same.
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = environment.from_string(source)
        self._special_tokens = {
            name: config[name]
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
            if isinstance(config.get(name), str)
        }
        tokenizer_file = str(model_path / "tokenizer.json")
        self._template_tokenizer = Tokenizer.from_file(tokenizer_file)
        # A second instance, not a flag flipped on the first: encoding runs in several threads.
        self._text_tokenizer = Tokenizer.from_file(tokenizer_file)
        self._text_tokenizer.encode_special_tokens = True

    def encode(self, messages: list[dict[str, str]], *, assistant_prefix: str = "") -> list[int]:
        """The prompt's token ids, ending with the assistant's turn opened (and, to continue an
        answer, `assistant_prefix` written in it as text); raises ChatTemplateError when the
        template refuses the messages."""
        placeholders = [{**message, "content": _PLACEHOLDER.format(n)} for n, message in enumerate(messages)]
        try:
            rendered = self._template.render(
                messages=placeholders, add_generation_prompt=True, **self._special_tokens
            )
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
        ids: list[int] = []
        # re.split with a group alternates template text and the captured message index.
        for n, piece in enumerate(_PLACEHOLDER_RE.split(rendered)):
            if n % 2:
                content = messages[int(piece)]["content"]
                ids += self._text_tokenizer.encode(content, add_special_tokens=False).ids
            elif piece:
                ids += self._template_tokenizer.encode(piece, add_special_tokens=False).ids
        if assistant_prefix:
            ids += self._text_tokenizer.encode(assistant_prefix, add_special_tokens=False).ids
        return ids

    def decode_token(self, token_id: int) -> str:
        """One token's text, special tokens included (as vLLM's server shows them in logprobs)."""
        return self._template_tokenizer.decode([token_id], skip_special_tokens=False)

    def encode_text(self, prompt: str, *, continuation: str = "") -> list[int]:
        """A raw prompt's token ids, as vLLM's completions endpoint encodes one: no chat template,
        the tokenizer's own special tokens added, and special tokens in the text recognised (the
        caller writes the whole prompt, so there is no turn of someone else's to forge). To
        continue an answer, `continuation` follows as text, encoded apart so that the prompt's
        tokens stay those it was first answered with."""
        ids = self._template_tokenizer.encode(prompt, add_special_tokens=True).ids
        if continuation:
            ids += self._text_tokenizer.encode(continuation, add_special_tokens=False).ids
        return ids


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@cache
def prompt_encoder(model_path: str) -> PromptEncoder | None:
    """The encoder for a model folder, loaded once per process; None without a tokenizer.json
    (the simulated engine, or a web host without the model)."""
    path = Path(model_path)
    if not (path / "tokenizer.json").is_file() or not (path / "tokenizer_config.json").is_file():
        return None
    return PromptEncoder(path)


def prompt_token_count(messages: list[dict[str, str]], *, model_path: str) -> int:
    """Tokens the prompt takes in the model's context: exact with the model's tokenizer, else
    the conservative bound above. Raises ChatTemplateError."""
    encoder = prompt_encoder(model_path)
    if encoder is not None:
        return len(encoder.encode(messages))
    text_bytes = sum(len(message["content"].encode()) for message in messages)
    return text_bytes + BOUND_TOKENS_PER_MESSAGE * len(messages) + BOUND_TEMPLATE_TOKENS


def text_prompt_token_count(prompt: str, *, model_path: str) -> int:
    """Tokens a raw prompt takes: exact with the model's tokenizer, else its UTF-8 bytes plus
    room for the special tokens a tokenizer adds."""
    encoder = prompt_encoder(model_path)
    if encoder is not None:
        return len(encoder.encode_text(prompt))
    return len(prompt.encode()) + BOUND_TOKENS_PER_MESSAGE
