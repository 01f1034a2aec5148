"""The check every sentence of a `verified` answer passes before the customer reads it, run by
the worker as the model writes (inference.answering): a sentence is shown once it is whole and
holds only what the help center's sentences the answer was given say.

A sentence fails when
- one of its facts (knowledge.facts: an amount, a percentage, a duration, a number, an email, a
  phone number, a link) is in no source sentence about the same thing (one sharing nearly as
  many of its subject words as the closest does): "the warranty on cast iron is 2 years" fails
  although another sentence says "2 years" of furniture; a fact the customer wrote in the
  question holds;
- it names what no source names ("Anchorage", "Afterpay");
- it says the opposite of the source sentence closest to it (one of the two negated: "you can
  return opened pillows" against "...cannot be returned: pillows ... once opened");
- it makes a claim (four subject words or more) that no source sentence comes near.
A sentence that fails is replaced by the source sentence closest to it, quoted as the help
center writes it, or left out when none is close; an answer of which nothing holds becomes the
decline. A sentence cut off by the length limit is never shown: answers end at a sentence.

This is exact for facts and names and a heuristic for meaning; MiniCheck-style models, which
judge meaning, have no weights on this machine's package registries (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from knowledge.facts import Fact, fact_values, facts, negated, supported
from knowledge.terms import terms
from scheduler.generation import Grounding, GroundingReport

# A sentence ends at . ! ? followed by a space, or at a line break: what is before it can be
# checked while the model writes on.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"”»)]*\s+|\n+")
CLAIM_WORDS = 4  # subject words from which a sentence is a claim the sources must come near
CLAIM_OVERLAP = 0.25  # share of its subject words a source sentence must share with a claim
QUOTE_OVERLAP = 0.3  # share of a failed sentence's subject words its replacement must share
SAME_SUBJECT = 0.5  # share of subject words from which two sentences speak of the same thing
# How much less of a sentence's subject the source stating one of its facts may share than the
# closest source does: a fact found only in a source about something else does not hold.
FACT_SUBJECT_SLACK = 0.2


@dataclass(frozen=True, slots=True)
class _Source:
    text: str
    terms: frozenset[str]
    values: frozenset[tuple[str, str]]
    negated: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    supported: bool
    reason: str = ""  # fact, name, contradiction or unrelated, when not supported
    closest: str | None = None  # the source sentence nearest it


def _overlap(subject: frozenset[str], other: frozenset[str]) -> float:
    return len(subject & other) / len(subject) if subject else 0.0


class SourceCheck:
    """The sources of one answer, ready to check its sentences against."""

    def __init__(self, grounding: Grounding) -> None:
        self._sources = [
            _Source(
                text=sentence,
                terms=frozenset(terms(f"{source.title} {sentence}")),
                values=frozenset(fact_values(sentence)),
                negated=negated(sentence),
            )
            for source in grounding.sources
            for sentence in source.sentences
        ]
        self._language = grounding.language
        self._question_values = frozenset(fact_values(grounding.question))
        self._names = frozenset(
            value for source in self._sources for kind, value in source.values if kind == "name"
        ) | frozenset(value for kind, value in self._question_values if kind == "name")

    def _fact_held(self, fact: Fact, subject: frozenset[str], nearness: float) -> bool:
        if supported(fact, set(self._question_values)):
            return True
        if fact.kind == "name":
            return fact.value in self._names
        return any(
            supported(fact, set(source.values))
            and _overlap(subject, source.terms) >= nearness - FACT_SUBJECT_SLACK
            for source in self._sources
        )

    def check(self, sentence: str) -> Verdict:
        subject = frozenset(terms(sentence))
        closest = max(self._sources, key=lambda source: _overlap(subject, source.terms), default=None)
        nearness = _overlap(subject, closest.terms) if closest is not None else 0.0
        quote = closest.text if closest is not None and nearness >= QUOTE_OVERLAP else None
        for fact in facts(sentence):
            if fact.kind == "name" and self._language == "de":
                continue  # German capitalises every noun: a capital is no sign of a name there
            if not self._fact_held(fact, subject, nearness):
                return Verdict(False, "name" if fact.kind == "name" else "fact", quote)
        if closest is not None and nearness >= SAME_SUBJECT and negated(sentence) != closest.negated:
            return Verdict(False, "contradiction", quote)
        if len(subject) >= CLAIM_WORDS and nearness < CLAIM_OVERLAP:
            return Verdict(False, "unrelated", quote)
        return Verdict(True, closest=quote)


@dataclass
class AnswerChecker:
    """Checks a streamed answer sentence by sentence: `feed` the model's text as it comes and
    get back what may be shown; `finish` at the end. The report says what happened."""

    grounding: Grounding
    style: str = "verified"
    _check: SourceCheck = field(init=False)
    _pending: str = ""
    _shown: list[str] = field(default_factory=list)
    _said: int = 0  # sentences shown that say something (a subject word or a fact)
    _quoted: set[str] = field(default_factory=set)
    checked: int = 0
    replaced: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        self._check = SourceCheck(self.grounding)

    def _sentence(self, sentence: str, ending: str) -> str:
        if not sentence.strip() or not any(char.isalnum() for char in sentence):
            return sentence + ending if self._shown else ""
        self.checked += 1
        verdict = self._check.check(sentence)
        if verdict.supported:
            self._shown.append(sentence)
            self._said += bool(terms(sentence) or facts(sentence))
            return sentence + ending
        if verdict.closest is not None and verdict.closest not in self._quoted:
            self._quoted.add(verdict.closest)
            self.replaced += 1
            self._shown.append(verdict.closest)
            self._said += 1
            return verdict.closest + ("\n\n" if "\n" in verdict.closest else " ")
        self.dropped += 1
        return ""

    def feed(self, text: str) -> str:
        """The text that may be shown now (whole sentences that hold, or their replacements)."""
        self._pending += text
        shown: list[str] = []
        while (end := _SENTENCE_END.search(self._pending)) is not None:
            sentence, ending = self._pending[: end.start()], end.group()
            self._pending = self._pending[end.end() :]
            shown.append(self._sentence(sentence, ending))
        return "".join(shown)

    def finish(self, *, cut_off: bool) -> str:
        """The rest: the last sentence when the model ended it (not `cut_off` by the length
        limit), and the decline when nothing that says anything was shown (a greeting or a "sure"
        alone answers nothing)."""
        rest, self._pending = self._pending, ""
        shown = "" if cut_off else self._sentence(rest.rstrip(), "")
        if self.declined:
            return f"{shown.rstrip()}\n\n{self.grounding.decline}" if self._shown else self.grounding.decline
        return shown.rstrip() if shown else ""

    @property
    def declined(self) -> bool:
        return not self._said

    def report(self) -> GroundingReport:
        return GroundingReport(
            style=self.style,
            checked=self.checked,
            replaced=self.replaced,
            dropped=self.dropped,
            declined="unsupported" if self.declined else "",
        )
