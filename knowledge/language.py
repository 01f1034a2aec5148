"""Which of the languages the help center answers in a text is written in: told from its most
common short words, which is enough for a question or a few sentences of English, French,
Spanish or German, and needs no model."""

from __future__ import annotations

import re

LANGUAGES = ("en", "fr", "es", "de")

_COMMON_WORDS = {
    "en": "the and you your is are to of for in it can we our will be with have this that not do "
    "please if or on an as by at from my i",
    "fr": "le la les des et vous votre vos est pour un une nous dans pas que qui sur avec ne au aux "
    "du ce sont pouvez être je il elle mais ou si",
    "es": "el los las y que en una es su para por con no se puede usted sus del al lo tiene está "
    "pero como si o",
    "de": "der die das und sie ist zu den ein eine nicht mit für von ihr ihre auf wir es können dem "
    "des bitte auch bei ich wenn oder sind",
}
_STOPWORDS = {language: frozenset(words.split()) for language, words in _COMMON_WORDS.items()}
_WORD = re.compile(r"\w+", re.UNICODE)


def common_word(word: str) -> bool:
    """Whether `word` is one of the common words of any of these languages (never a name)."""
    return any(word.lower() in common for common in _STOPWORDS.values())


def text_language(text: str) -> str | None:
    """The language whose common words the text uses most, or None for none at all."""
    words = [word.lower() for word in _WORD.findall(text)]
    counts = {language: sum(word in common for word in words) for language, common in _STOPWORDS.items()}
    best = max(counts, key=lambda language: counts[language])
    return best if counts[best] else None
