"""The system prompt an answer is written under: the assistant's own prompt, plus what the help
center says about the customer's message. The chat and the quality score build it here, so the
score measures the prompt customers get."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from knowledge.selectors import EmbedderUnavailable, Source, help_center_excerpts

logger = logging.getLogger(__name__)

# The help center decides what the assistant may say: a small model asked without it invents
# policies, and one told to keep to excerpts still needs to be told what to do without any.
HELP_CENTER_PROMPT = (
    "Answer only from these excerpts of our help center. If they do not answer the question, "
    "say that you do not know, and offer to put the customer in touch with a person from our "
    "team or ask what exactly they need. Never make up policies, prices or dates.\n\n{excerpts}"
)
NO_HELP_CENTER_MATCH_PROMPT = (
    "Our help center has nothing on this message. If it is a greeting or thanks, reply briefly. "
    "Otherwise say that you do not know, and offer to put the customer in touch with a person "
    "from our team or ask what exactly they need. Never make up policies, prices or dates."
)


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    text: str
    excerpt_chars: int  # characters of help-center excerpts in `text`
    sources: tuple[Source, ...]  # the articles quoted, best first
    kb_version: int | None = None  # the knowledge base searched; None: not searched


def system_prompt_build(
    *,
    question: str,
    assistant_prompt: str,
    use_help_center: bool = True,
    vector: np.ndarray | None = None,
) -> SystemPrompt:
    """The system prompt for `question`: `assistant_prompt`, then the help center's excerpts on
    it (or what to do when it has none). Without the help center, `assistant_prompt` alone.
    `vector`: the question's embedding, if already made."""
    if not use_help_center:
        return SystemPrompt(assistant_prompt, 0, ())
    try:
        found = help_center_excerpts(question=question, vector=vector)
    except EmbedderUnavailable:
        logger.warning("Answering without the help center: its embedding model is not prepared")
        return SystemPrompt(assistant_prompt, 0, ())
    if not found.excerpts:
        return SystemPrompt(f"{assistant_prompt}\n\n{NO_HELP_CENTER_MATCH_PROMPT}", 0, (), found.version)
    excerpts = "\n\n".join(
        f"## {excerpt.source.title}{f' / {excerpt.heading}' if excerpt.heading else ''}\n{excerpt.text}"
        for excerpt in found.excerpts
    )
    return SystemPrompt(
        text=f"{assistant_prompt}\n\n{HELP_CENTER_PROMPT.format(excerpts=excerpts)}",
        excerpt_chars=sum(len(excerpt.text) for excerpt in found.excerpts),
        sources=found.sources,
        kb_version=found.version,
    )
