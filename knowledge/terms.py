"""The terms of a text, as the help center's lexical match compares them: words folded (lower
case, no accents), the grammar and asking words left out, cut to a rough stem ("returns",
"returned" -> "return"), and a customer's typo mended to the help center's word when one edit
away ("shiping" -> "shipping"). Sentence embeddings miss what a rare word says ("Switzerland",
"Klarna", "freight"); these terms catch it (knowledge.retrieval)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from knowledge.facts import words
from knowledge.language import asking_word

# Longest first; a stem keeps at least MIN_STEM letters.
_SUFFIXES = ("ations", "ation", "ments", "ment", "ings", "ing", "ies", "es", "s", "ed", "er", "ly", "en", "e")
_MIN_STEM = 3
_MIN_MENDED = 5  # shorter words are not mended: one edit away, too many words are another


def stem(word: str) -> str:
    """Suffixes cut until none is left, so that every form of a word meets at one stem:
    "backorders" and "backorder" both become "backord", not "backorder" and "backord"."""
    cut = True
    while cut:
        cut = False
        for suffix in _SUFFIXES:
            if len(word) > len(suffix) + _MIN_STEM and word.endswith(suffix):
                word, cut = word[: -len(suffix)], True
                break
    return word


def terms(text: str) -> list[str]:
    """The stems of the words that say what `text` is about, in order."""
    return [stem(word) for word in words(text.replace("**", "")) if len(word) > 1 and not asking_word(word)]


def _deletions(word: str) -> set[str]:
    return {word[:i] + word[i + 1 :] for i in range(len(word))}


@dataclass(frozen=True, slots=True)
class Lexicon:
    """The terms of one language's articles: in how many articles each appears (`article_counts`)
    and how rare that makes it (`idf`), and for mending typos, each term's deletions."""

    article_counts: dict[str, int]
    articles: int
    _by_deletion: dict[str, tuple[str, ...]]

    @classmethod
    def build(cls, article_terms: Iterable[set[str]]) -> Lexicon:
        counts: Counter[str] = Counter()
        articles = 0
        for found in article_terms:
            counts.update(found)
            articles += 1
        by_deletion: dict[str, list[str]] = {}
        for term in counts:
            for key in {term, *_deletions(term)}:
                by_deletion.setdefault(key, []).append(term)
        return cls(dict(counts), articles, {key: tuple(found) for key, found in by_deletion.items()})

    def idf(self, term: str) -> float:
        count = self.article_counts.get(term, 0)
        return math.log(1 + self.articles / count) if count else 0.0

    def known(self, term: str) -> bool:
        return term in self.article_counts

    def mend(self, term: str) -> str:
        """`term` itself when known, else the most common known term one edit away (a letter
        dropped, added, changed or two swapped), else `term`."""
        if term in self.article_counts:
            return term
        near: set[str] = set(self._by_deletion.get(term, ()))  # a letter added
        for deleted in _deletions(term):
            near.update(self._by_deletion.get(deleted, ()))  # dropped, changed or swapped
        near = {candidate for candidate in near if _one_edit(term, candidate)}
        if not near:
            return term
        return max(sorted(near), key=lambda candidate: self.article_counts[candidate])

    def question_terms(self, text: str) -> list[str]:
        """The terms of a question, those of its longer words mended (a word of four letters is
        one edit away from too many others)."""
        return [
            self.mend(stem(word)) if len(word) >= _MIN_MENDED else stem(word)
            for word in words(text.replace("**", ""))
            if len(word) > 1 and not asking_word(word)
        ]


def _one_edit(a: str, b: str) -> bool:
    """Levenshtein distance at most 1, or two neighbouring letters swapped."""
    if a == b:
        return True
    if len(a) == len(b):
        diffs = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diffs) == 1 or (
            len(diffs) == 2
            and diffs[1] == diffs[0] + 1
            and a[diffs[0]] == b[diffs[1]]
            and a[diffs[1]] == b[diffs[0]]
        )
    shorter, longer = sorted((a, b), key=len)
    return len(longer) - len(shorter) == 1 and any(
        longer[:i] + longer[i + 1 :] == shorter for i in range(len(longer))
    )


def coverage(question_terms: list[str], found: set[str], lexicon: Lexicon) -> float:
    """The share of the question's terms known to the help center, each weighted by its
    rarity, that `found` holds."""
    weights = {term: lexicon.idf(term) for term in set(question_terms) if lexicon.known(term)}
    total = sum(weights.values())
    return sum(weight for term, weight in weights.items() if term in found) / total if total else 0.0
