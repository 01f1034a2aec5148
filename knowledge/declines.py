"""When the help center does not answer a message: the assistant then says so and offers a
person from the team, instead of quoting something near the question or letting a model guess.

Some passage is always found for a question; whether it answers the question is the hard part,
and no model that runs here judges it better than chance (a yes/no judgement asked of the
shipped 135M model scored 0.49 of area under the curve on the tuning questions). So the decision
reads what can be read exactly, in each of the four languages:
- nothing to go on: no words (an emoji, a link), or nothing found at all;
- a request to drop the rules ("ignore your instructions..."): never obeyed, never answered;
- a question about one order's own state ("where is my order LH2093?"): no article knows it;
- a name the help center never uses ("Afterpay", "Berlin", the "Margaux" sideboard): it asks
  about something the shop's articles do not cover (a payment method, a place, a product);
- what a shop's help center may not cover, when its articles have no word for it: a product's
  stock or measurements, a shop or showroom to visit, a discount for a group;
- a question whose best sentence is far from it (`MIN_SIMILARITY`).
Each reason is named, recorded with the answer and counted per variant.
"""

from __future__ import annotations

import re
from enum import StrEnum

from knowledge.facts import words
from knowledge.language import asking_word
from knowledge.retrieval import Retrieval
from knowledge.terms import stem, terms

# The best sentence's similarity to the question under which nothing is quoted (multilingual
# e5: unrelated questions score about 0.80-0.84 against the demo help center, answered ones
# mostly above 0.84). Chosen on the tuning questions (docs/BENCHMARKS.md "Grounded answers"):
# the middle of the range, 0.847 to 0.850, that answers and declines the most of them.
MIN_SIMILARITY = 0.848


class DeclineReason(StrEnum):
    NO_WORDS = "no_words"
    NOTHING_FOUND = "nothing_found"
    INSTRUCTIONS = "instructions"
    ONE_ORDER = "one_order"
    UNKNOWN_NAME = "unknown_name"
    NOT_COVERED = "not_covered"
    FAR = "far"


_INSTRUCTIONS = re.compile(
    r"\b(?:ignore|disregard|forget)\b.{0,40}\b(?:instructions?|rules|prompt|guidelines|help ?cent(?:er|re)"
    r"|polic(?:y|ies)|knowledge base)\b"
    r"|system prompt|developer mode|admin mode|jailbreak|\byou are now\b|pretend (?:to be|you are)"
    r"|\b(?:oublie[rz]?|ignore[rz]?)\b.{0,40}\b(?:instructions?|r[èe]gles|consignes|centre d'aide)\b"
    r"|\b(?:olvida|ignora)\w*\b.{0,40}\b(?:instrucciones|reglas|normas|centro de ayuda)\b"
    r"|\b(?:ignorier\w*|vergiss\w*)\b.{0,40}\b(?:anweisungen|regeln|vorgaben|hilfe-?center)\b",
    re.IGNORECASE | re.DOTALL,
)
# An order's reference, and a question about where it is or what became of it.
_ORDER_REFERENCE = re.compile(r"\b[A-Z]{1,4}-?\d{5,}\b|#\d{5,}|\b\d{7,}\b")
_ORDER_STATE = re.compile(
    r"\bwhere\b|\bstatus\b|\bshipped\b|has it|gone out|\btrack|\bcheck\b|\bo[uù]\b|statut|exp[ée]di"
    r"|d[oó]nde|estado|enviado|\bwo\b|versendet|verschickt",
    re.IGNORECASE,
)
# What a shop's help center may not cover, and its customers ask about: the catalogue (stock,
# sizes, materials), places to visit, discounts for groups of people. A question on one of these
# is declined when the help center has no word for it (knowledge.terms): "student" in no
# article, or a showroom nobody mentions; a help center that speaks of them answers them.
_SHOP_TOPICS = re.compile(
    r"\bin stock\b|back in stock|how many .{0,20}\bleft\b|\bdimensions?\b|how (?:big|tall|wide|heavy)|made of"
    r"|en stock|\bdimensions?\b|quedan|en existencia|\bmedidas\b|auf lager|\bma(?:ß|ss)e\b"
    r"|\bshowrooms?\b|physical (?:store|shop)|brick and mortar|\bin person\b|visit (?:a|your) (?:store|shop)"
    r"|(?:store|shop) (?:in|near)\b|\bboutiques?\b|\bmagasins?\b|tienda f[ií]sica|tiendas? en\b|\bladen in\b"
    r"|\bfiliale|ausstellungsraum|\bpick (?:it |them |my order |up )?up\b"
    r"|\bcollect (?:it|my order) (?:at|from)\b"
    r"|retrait en magasin|recoger en|abholen"
    r"|\b(?:student|military|veteran|senior|teacher|nurse|first responder|employee|healthcare)s?\b"
    r"|[ée]tudiants?|militaires?|enseignants?|estudiantes?|militares|jubilados?|profesores"
    r"|studenten|sch[üu]ler|rentner|senioren|lehrer|soldaten",
    re.IGNORECASE,
)
_NAME = re.compile(r"(?<![\w.])(?:[A-Z][a-z]+(?:[A-Z]\w+)?|[A-Z]{2,}|[a-z]+[A-Z]\w*)\b")
_REGION_AFTER = re.compile(r",\s*([A-Z]\w+)")  # "Anchorage, Alaska"
_SENTENCE_START = re.compile(r"(?:^|[.!?:;]\s*|[\"“«(¿¡]\s*)$")


def _known_name(word: str, retrieval: Retrieval) -> bool:
    """Whether an article in any language uses the word, exactly: one letter off, a name is
    often another word ("iPhone", "phone")."""
    (folded,) = words(word) or [""]
    term = stem(folded)
    return not term or any(lexicon.known(term) for lexicon in retrieval.index.lexicons.values())


def _unknown_names(retrieval: Retrieval) -> list[str]:
    """Capitalised words of the question (not starting it or a sentence) that no article in any
    language uses. A place named with the region the help center names ("Anchorage, Alaska")
    is that region's: the answer about Alaska answers it."""
    if retrieval.language == "de":
        return []  # German capitalises every noun: a capital is no sign of a name there
    question = retrieval.question
    unknown: list[str] = []
    for match in _NAME.finditer(question):
        word = match.group()
        if _SENTENCE_START.search(question[: match.start()]) or asking_word(word):
            continue
        if _known_name(word, retrieval):
            continue
        region = _REGION_AFTER.match(question, match.end())
        if region is not None and _known_name(region.group(1), retrieval):
            continue
        unknown.append(word)
    return unknown


def _uncovered_topic(retrieval: Retrieval) -> str | None:
    """The first shop topic the question asks about that no sentence of the searched articles
    speaks of: none holds all its words (with its section's heading and its article's title).
    Words found apart say nothing of it: "pick the items" and "your order" are no pick-up."""
    index = retrieval.index
    for match in _SHOP_TOPICS.finditer(retrieval.question):
        # Only a question that names a topic pays for the pass over the sentences.
        topic = set(terms(match.group()))
        if not any(
            topic <= sentence.terms
            for sentence, language in zip(index.sentences, index.sentence_language, strict=True)
            if language == retrieval.searched_language
        ):
            return match.group()
    return None


def decline_reason(question: str, retrieval: Retrieval | None) -> DeclineReason | None:
    """Why the help center does not answer `question` (None: it does). `retrieval` is None
    when the help center has no articles."""
    if not any(char.isalpha() for char in re.sub(r"https?://\S+|www\.\S+", "", question)):
        return DeclineReason.NO_WORDS
    if _INSTRUCTIONS.search(question):
        return DeclineReason.INSTRUCTIONS
    if _ORDER_REFERENCE.search(question) and _ORDER_STATE.search(question):
        return DeclineReason.ONE_ORDER
    if retrieval is None or not retrieval.ranked:
        return DeclineReason.NOTHING_FOUND
    if _unknown_names(retrieval):
        return DeclineReason.UNKNOWN_NAME
    if _uncovered_topic(retrieval) is not None:
        return DeclineReason.NOT_COVERED
    if retrieval.similarity < MIN_SIMILARITY and not retrieval.follow_up:
        return DeclineReason.FAR
    return None
