"""How a chat message is answered, by a variant's answer style (scheduler.models.Variant):

- `extractive`: the help center's own sentences, chosen for the question (knowledge.extractive),
  with no model: written in the web process, it can be incomplete but never invents;
- `verified`: a model writes from the help center's excerpts, and the worker shows each
  sentence only once it is checked against them (knowledge.grounding);
- `generated`: a model writes from the excerpts, unchecked.

Every style first asks whether the help center answers the message at all (knowledge.declines)
and gives the honest decline when it does not, and greets back a greeting. The chat
(chat.services.message_post) and the quality score (knowledge.quality) both plan answers here,
so the score measures what customers get.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from django.conf import settings

from knowledge.chunking import passage_sentences
from knowledge.declines import DeclineReason, decline_reason
from knowledge.embedding import EmbedderUnavailable
from knowledge.extractive import extract
from knowledge.history import kept, window_start
from knowledge.prompts import decline_text, question_text, small_talk, small_talk_reply, system_prompt_text
from knowledge.retrieval import Retrieval, message_language, retrieve
from knowledge.selectors import Source, excerpts_of
from scheduler.admission import HELP_CENTER, KnownAnswer
from scheduler.generation import Grounding, GroundingReport, GroundingSource
from scheduler.models import Variant

Style = Variant.AnswerStyle
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """Either an answer known without a model (`known`), or the `messages` a model answers,
    with the `grounding` its sentences are checked against (the verified style)."""

    known: KnownAnswer | None
    messages: list[dict[str, str]]
    sources: tuple[Source, ...]
    grounding: Grounding | None = None
    kb_version: int | None = None  # the help center's version searched; None: not searched
    # The help center's text the answer was given (the sentences quoted, or the excerpts a model
    # read): what its facts must come from (knowledge.quality counts those that do not).
    support: tuple[str, ...] = ()

    @property
    def declined(self) -> bool:
        return (
            self.known is not None
            and self.known.grounding is not None
            and bool(self.known.grounding.declined)
        )


def _known(text: str, *, style: str, started: float, declined: str = "", checked: int = 0) -> KnownAnswer:
    return KnownAnswer(
        text=text,
        engine=HELP_CENTER,
        lookup_ms=(time.perf_counter() - started) * 1000,
        completion_tokens=0,
        grounding=GroundingReport(style=style, checked=checked, declined=declined),
    )


def _with_history(
    system: str, history: list[dict[str, str]], message: str, *, room: int
) -> list[dict[str, str]]:
    """The system prompt, the recent history that fits `room` characters (knowledge.history),
    then the message: the prompt must leave room for the answer inside the model's context."""
    recent = kept(history[window_start(len(history)) :], room=room)
    return [{"role": "system", "content": system}, *recent, {"role": "user", "content": message}]


def answer_plan(
    *,
    variant: Variant,
    message: str,
    history: list[dict[str, str]] = (),  # type: ignore[assignment]
    previous_sources: list[str] = (),  # type: ignore[assignment]
    vector: np.ndarray | None = None,
) -> AnswerPlan:
    """How to answer `message` on `variant`. `history`: the conversation's earlier messages,
    oldest first ({"role", "content"}); `previous_sources`: the slugs the previous answer quoted;
    `vector`: the message's embedding, if already made. Reads the help center (sync)."""
    started = time.perf_counter()
    history = list(history)
    style = variant.answer_style
    asked_before = [turn["content"] for turn in history if turn["role"] == "user"]
    language = message_language(message, asked_before)
    if small_talk(message) and style == Style.EXTRACTIVE:
        return AnswerPlan(_known(small_talk_reply(message, language), style=style, started=started), [], ())
    if small_talk(message) or not variant.knowledge:
        system = system_prompt_text(assistant_prompt=variant.system_prompt, excerpts_found=False)
        if not variant.knowledge:
            system = variant.system_prompt
        return AnswerPlan(
            None, _with_history(system, history, message, room=settings.CHAT_HISTORY_MAX_CHARS), ()
        )
    retrieval: Retrieval | None
    try:
        retrieval = retrieve(
            question=message, history=asked_before, previous_sources=list(previous_sources), vector=vector
        )
    except EmbedderUnavailable:
        # The help center cannot be searched: declining is honest, guessing is not.
        logger.warning("Declining: the help center's embedding model cannot load")
        known = _known(
            decline_text(language), style=style, started=started, declined=DeclineReason.NOTHING_FOUND
        )
        return AnswerPlan(known, [], ())
    if retrieval is None and style != Style.EXTRACTIVE:
        # No article to search: a model answers as it would without the help center, told to
        # say that it does not know (and a verified answer is checked against nothing).
        system = system_prompt_text(assistant_prompt=variant.system_prompt, excerpts_found=False)
        grounding = None
        if style == Style.VERIFIED:
            grounding = Grounding(
                question=message, language=language, sources=(), decline=decline_text(language)
            )
        messages = _with_history(system, history, message, room=settings.CHAT_HISTORY_MAX_CHARS)
        return AnswerPlan(None, messages, (), grounding)
    kb_version = retrieval.index.version if retrieval is not None else None
    reason = decline_reason(message, retrieval)
    if reason is not None:
        text = decline_text(language, one_order=reason == DeclineReason.ONE_ORDER)
        known = _known(text, style=style, started=started, declined=reason)
        return AnswerPlan(known, [], (), kb_version=kb_version)
    assert retrieval is not None
    if style == Style.EXTRACTIVE:
        extracted = extract(retrieval)
        assert extracted is not None  # decline_reason declines when nothing was found
        sources = tuple(Source(article.slug, article.title) for article in extracted.sources)
        known = _known(extracted.text, style=style, started=started, checked=len(extracted.sentences))
        return AnswerPlan(known, [], sources, kb_version=kb_version, support=extracted.sentences)
    excerpts = excerpts_of(retrieval)
    system = system_prompt_text(assistant_prompt=variant.system_prompt, excerpts_found=bool(excerpts))
    question = question_text(question=message, excerpts=excerpts) if excerpts else message
    # The history's room is what the excerpts may take at most, not what this question's took:
    # each turn then keeps the earlier messages the last one kept (knowledge.history).
    room = settings.CHAT_HISTORY_MAX_CHARS - settings.KNOWLEDGE_PROMPT_MAX_CHARS
    messages = _with_history(system, history, question, room=room)
    sources = tuple(dict.fromkeys(excerpt.source for excerpt in excerpts))
    grounding = None
    if style == Style.VERIFIED:
        grounding = Grounding(
            question=message,
            language=language,
            sources=tuple(
                GroundingSource(
                    excerpt.source.slug, excerpt.source.title, tuple(passage_sentences(excerpt.text))
                )
                for excerpt in excerpts
            ),
            decline=decline_text(language),
        )
    support = tuple(excerpt.text for excerpt in excerpts)
    return AnswerPlan(None, messages, sources, grounding, kb_version, support)
