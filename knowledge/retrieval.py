"""Finding what the help center says about a customer's message: its sentences ranked for the
question, in the customer's language, with the conversation it belongs to.

A sentence's score adds up what each signal says, weighed on the tuning questions
(knowledge/questions/tuning.json; docs/BENCHMARKS.md, "Grounded answers"):
- the question's embedding against the sentence's and its passage's (multilingual e5: a
  paraphrase or a typo still matches);
- for a follow-up, the same with the customer's previous message joined to it ("and how long
  does that take?" means nothing alone), and the articles the previous answer quoted;
- the share of the question's rare terms that the sentence and its article hold
  (knowledge.terms: "Switzerland" or "Klarna" decides more than its embedding shows);
- whether the sentence states the kind of fact the question asks for ("how much": an amount;
  "how long", "when": a duration or a time), so a price question is not answered with a delay.

Sentences are searched in the question's language when the help center has articles in it;
otherwise in the language of its original articles (the multilingual embedding matches across
languages), and the answer says that it quotes another language.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from knowledge.embedding import embed_queries
from knowledge.index import KnowledgeIndex, current_index
from knowledge.language import text_language
from knowledge.terms import coverage

# Weights, on the scale of a cosine similarity (knowledge/questions/tuning.json).
PASSAGE_WEIGHT = 0.5  # the passage's similarity beside the sentence's own (weight 1)
FOLLOW_UP_WEIGHT = 1.0  # the question joined to the previous message, beside the question alone
ARTICLE_TERMS_WEIGHT = 0.01
SENTENCE_TERMS_WEIGHT = 0.015
PREVIOUS_SOURCE_WEIGHT = 0.02
FACT_KIND_WEIGHT = 0.02
RANKED = 12  # sentences kept, best first

# What a question asks for, in the four languages, and the kinds of facts that answer it.
_ASKS_FOR = (
    (
        re.compile(
            r"how much|\bcosts?\b|\bprice|\bfees?\b|\bcharges?\b|combien|co[uû]te?|\bprix|tarif|\bfrais"
            r"|cu[aá]nto (?:cuesta|vale|es|cobr)|precio|coste|costo"
            r"|wie ?viel|kostet|\bpreis|geb[uü]hr|\bkosten",
            re.IGNORECASE,
        ),
        frozenset({"amount", "percent"}),
    ),
    (
        re.compile(
            r"how long|how soon|how many (?:days|weeks|hours)|\bwhen\b|by when|how quickly|combien de temps"
            r"|\bquand|d[ée]lai|cu[aá]nto tiempo|cu[aá]ndo|plazo|cu[aá]nto tarda|wie lange|\bwann\b|\bdauer"
            r"|bis wann|wie schnell",
            re.IGNORECASE,
        ),
        frozenset({"duration", "number"}),
    ),
)


def _asks_for(question: str) -> frozenset[str]:
    return frozenset().union(*(kinds for pattern, kinds in _ASKS_FOR if pattern.search(question)))


@dataclass(frozen=True, slots=True)
class Ranked:
    sentence: int  # into the index's sentences
    score: float


@dataclass(frozen=True, slots=True)
class Retrieval:
    """The help center's sentences for one message, best first, and what the decision to answer
    reads (knowledge.declines)."""

    index: KnowledgeIndex
    question: str
    language: str  # the customer's language
    searched_language: str  # the articles' language searched
    ranked: tuple[Ranked, ...]
    similarity: float  # the best plain similarity of the question to a sentence searched
    follow_up: bool


def _originals_language(index: KnowledgeIndex) -> str:
    """The language most of the help center's original articles (not translations) are in."""
    languages = [article.language for article in index.articles if article.original == article.slug]
    return max(sorted(set(languages)), key=languages.count)


def message_language(message: str, history: list[str]) -> str:
    """The customer's language: the message's own, else the conversation's, else English."""
    for text in (message, *reversed(history)):
        language = text_language(text)
        if language is not None:
            return language
    return "en"


def retrieve(
    *,
    question: str,
    history: list[str] = (),  # type: ignore[assignment]
    previous_sources: list[str] = (),  # type: ignore[assignment]
    vector: np.ndarray | None = None,
) -> Retrieval | None:
    """The help center's sentences for `question`, best first; None when it has no articles.
    `history`: the customer's earlier messages in the conversation, oldest first;
    `previous_sources`: the slugs the previous answer quoted; `vector`: the question's
    embedding, if already made. Raises EmbedderUnavailable."""
    index = current_index.get()
    if not index.sentences:
        return None
    history = list(history)
    language = message_language(question, history)
    searched = language if language in index.languages else _originals_language(index)
    queries = [question]
    if history:
        queries.append(f"{history[-1]} {question}")
    vectors = embed_queries(queries if vector is None else queries[1:])
    if vector is not None:
        vectors = np.vstack([vector[None, :], vectors])
    sentence_scores = vectors @ index.sentence_matrix.T
    passage_scores = (vectors @ index.chunk_matrix.T)[:, index.sentence_chunk]
    dense = (sentence_scores + PASSAGE_WEIGHT * passage_scores) / (1 + PASSAGE_WEIGHT)
    score = (
        dense[0] if len(queries) == 1 else (dense[0] + FOLLOW_UP_WEIGHT * dense[1]) / (1 + FOLLOW_UP_WEIGHT)
    )
    in_language = index.sentence_language == searched
    lexicon = index.lexicons[searched]
    question_terms = lexicon.question_terms(question)
    # A follow-up's subject is often in the message before it ("Japan", then "how long?"): it
    # counts for the article, the question's own terms for the sentence.
    subject_terms = lexicon.question_terms(" ".join([*history[-1:], question]))
    if question_terms:
        article_cover = np.array(
            [coverage(subject_terms, set(found), lexicon) for found in index.article_terms]
        )
        score = score + ARTICLE_TERMS_WEIGHT * article_cover[index.sentence_article]
        candidates = np.flatnonzero(in_language)
        sentence_cover = np.zeros(len(index.sentences))
        sentence_cover[candidates] = [
            coverage(question_terms, set(index.sentences[i].terms), lexicon) for i in candidates
        ]
        score = score + SENTENCE_TERMS_WEIGHT * sentence_cover
    wanted = _asks_for(question)
    if wanted:
        answering = np.zeros(len(index.sentences), dtype=bool)
        for kind in wanted & index.sentence_fact_kinds.keys():
            answering |= index.sentence_fact_kinds[kind]
        score = score + FACT_KIND_WEIGHT * answering
    if previous_sources:
        originals = {article.original for article in index.articles if article.slug in set(previous_sources)}
        quoted = np.array([article.original in originals for article in index.articles])
        score = score + PREVIOUS_SOURCE_WEIGHT * quoted[index.sentence_article]
    score = np.where(in_language, score, -np.inf)
    best = np.argsort(-score)[:RANKED]
    return Retrieval(
        index=index,
        question=question,
        language=language,
        searched_language=searched,
        ranked=tuple(Ranked(int(i), float(score[i])) for i in best if np.isfinite(score[i])),
        similarity=float(np.max(np.where(in_language, sentence_scores[0], -1.0))),
        follow_up=bool(history),
    )
