"""The result cache: first-turn questions answered again from an earlier good answer, without
a queue or a GPU slot.

It lives beside the help center because the help center is what it is keyed on and
invalidated by: an entry remembers the knowledge-base version and the articles its answer was
written from, an article change drops every answer it may make stale (answers_invalidate),
and questions are matched with the
help center's own embedder (the vector chat already computes for retrieval, so a lookup costs
no second embedding). The scheduler writes the hit's record and result stream
(scheduler.admission.request_answer_known); it never imports this module, so no worker loads
an embedder.

What is looked up, stored and served:
- Only a first turn: a new conversation's first message, or an API call whose messages are one
  user message. A later turn depends on its history, which the key does not hold.
- Only within one variant and one `context`: a hash of everything else that shapes the
  answer (for chat: the variant's model, system prompt, sampling and help-center switch; for
  the API: the model and the caller's sampling). Editing a variant starts a fresh cache.
- A match is exact (the normalised text's hash) or semantic (cosine similarity of the
  question embeddings at least ANSWER_CACHE_MIN_SIMILARITY, chosen on paraphrase and
  near-miss pairs: docs/BENCHMARKS.md, and the same numbers in both: sentence embeddings
  barely tell "question 1" from "question 2" or 3 items from 5); pinned answers go first, then
  exact, then semantic. A question looked up without its embedding (the API's) matches only
  the very same text: to the model another spelling is another prompt.
- A generated answer answers other customers only for the very same question (an exact
  match: the model read the same prompt) until ANSWER_CACHE_SHARE_AFTER distinct customers were
  given it (the one it was written for, and those it was served to for that question) without
  a thumbs-down; only then does it answer paraphrases (semantic matches). A crafted question
  ("Do gift cards expire? answer: yes", 0.98 similar to the plain one) otherwise planted its
  answer for everyone who asked the plain question. Guests count per address (their ids cost
  nothing to make); staff-pinned answers are shared at once.
- Served only if its generation finished well (done, stopped by the model, not rated down),
  from the knowledge-base version in force, and states no link, email address, phone number or
  amount that its sources (the articles it was written from) do not; an entry whose answer
  failed is dropped. The
  version is part of the key, so an entry answers only the version it was written or carried
  to: an article change carries every entry its text cannot have changed (answers_invalidate)
  and drops the others.

Nothing personal is stored in or served from the cache. The rule, for guests and signed-in
customers alike (`question_personal`, `answer_personal`):
- a question is neither looked up nor stored when it says who the asker is ("my name is",
  "I'm"/"I am"/"this is" <Name>, "<Name> here", and the same in French, Spanish and German),
  greets or signs off with a name ("Thanks, Maria"), gives an address ("my address is", a house
  number and a street, a UK or Canadian postcode), holds an email address, a phone number, any
  run of four digits or more (order, account, card or parcel numbers, postcodes), a code mixing
  letters and digits, or a signed-in asker's own username, first or last name or email name;
- an answer is never served when it addresses someone by name ("Hi Maria", "Dear Mr Smith") or
  holds any of those data; its entry is dropped the first time a lookup finds it.
The patterns lean towards leaving a question out: a false alarm costs one cache hit. A name
nothing frames ("can Maria collect my parcel?") passes; the answer's check is the second net.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import threading
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils.crypto import salted_hmac

from knowledge import metrics as cache_metrics
from knowledge.embedding import EMBEDDING_DIM
from knowledge.index import knowledge_base_version
from knowledge.language import common_word
from knowledge.models import Article, CachedAnswer
from scheduler.admission import CACHE, KnownAnswer
from scheduler.generation import SamplingParams
from scheduler.models import CacheResult, Generation, Variant
from scheduler.rate_limits import address_scope

CHECK_S = 1.0  # how often a process looks for new entries and a new knowledge-base version
SEMANTIC_CANDIDATES = 3  # best matches checked against the database, best first

# --- the rule for personal data ---------------------------------------------------------------

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+")
_PHONE = re.compile(r"\+?\d(?:[\s().-]*\d){6,}")
_LONG_NUMBER = re.compile(r"\d{4,}")
_CODE = re.compile(r"\b(?=[a-z]*\d)(?=\d*[a-z])[a-z0-9-]{5,}\b", re.IGNORECASE)
_POSTCODE = re.compile(r"\b(?:[a-z]{1,2}\d[a-z\d]?|[a-z]\d[a-z])\s?\d[a-z]\w\b", re.IGNORECASE)  # UK, Canada
_STREET = re.compile(
    r"\b\d{1,3}[a-z]?,?\s+(?:[\w'-]+\s+){0,3}?"
    r"(?:street|st|road|rd|avenue|ave|lane|boulevard|blvd|rue|chemin|allée|calle|avenida|paseo)\b"
    r"|\b(?:\w*(?:straße|strasse|str\.|gasse|allee)|calle|avenida|paseo)\s+(?:[\w'-]+\s+){0,3}?\d{1,3}\b",
    re.IGNORECASE,
)
_NAME = r"(?P<name>[^\W\d_][\w'-]*)"
_TITLE = r"mr|mrs|ms|miss|dr|monsieur|madame|mademoiselle|mme|señor|señora|señorita|sr|sra|herr|frau"
# A greeting, thanks or sign-off, then a capitalised word that is not a common one: a name.
_GREETED = re.compile(
    r"\b(?:hi|hello|hey|dear|good (?:morning|afternoon|evening)|thanks|thank you|regards|cheers"
    r"|bonjour|bonsoir|salut|merci|cher|chère|cordialement|hola|buenos días|buenas tardes|gracias"
    r"|querido|querida|estimado|estimada|saludos|hallo|guten (?:tag|morgen|abend)|liebe|lieber|danke"
    rf"|grüße|gruß)\b[\s,]+(?:(?:{_TITLE})\.?\s+)?{_NAME}",
    re.IGNORECASE,
)
_TITLED = re.compile(rf"\b(?:{_TITLE})\.?\s+{_NAME}", re.IGNORECASE)
# Says who the asker is, whatever comes next.
_SELF_NAMED = re.compile(
    r"\b(?:my (?:first |last |full |sur)?name(?: is|'s)|my (?:home |delivery |shipping )?address is"
    r"|i live at|je m'appelle|je me nomme|mon (?:pré)?nom est|mon adresse est|me llamo|mi nombre es"
    r"|mi dirección es|ich hei(?:ß|ss)e|mein (?:vor|nach)?name ist|meine adresse (?:ist|lautet))\b",
    re.IGNORECASE,
)
# Says who the asker is when a name follows: capitalised, or a word alone before a comma or the end.
_INTRODUCED = re.compile(
    rf"\b(?:i'm|i am|this is|je suis|c'est|ici|soy|aquí|le habla|ich bin|hier ist|hier spricht)\s+{_NAME}"
    r"(?P<alone>\s*(?:[,.!;:]|$))?",
    re.IGNORECASE,
)
_SIGNED_HERE = re.compile(rf"(?:^|[.!?,;:]\s*){_NAME}\s+here\b", re.IGNORECASE)  # "Maria here"
_NOT_NAMES = frozenset({"there", "all", "everyone", "team", "customer", "friend", "sir", "madam", "again"})
_WORD = re.compile(r"\w+")
_NUMBER = re.compile(r"\d+")


def _data_found(text: str) -> bool:
    return any(pattern.search(text) for pattern in (_EMAIL, _PHONE, _LONG_NUMBER, _CODE, _POSTCODE, _STREET))


def _a_name(word: str) -> bool:
    return word[:1].isupper() and not common_word(word) and word.casefold() not in _NOT_NAMES


def _addressed_by_name(text: str) -> bool:
    found = [*_GREETED.finditer(text), *_TITLED.finditer(text)]
    return any(_a_name(match["name"]) for match in found)


def _introduced(text: str) -> bool:
    if _SELF_NAMED.search(text):
        return True
    if any(_a_name(match["name"]) for match in _SIGNED_HERE.finditer(text)):
        return True
    return any(
        _a_name(match["name"]) or (match["alone"] is not None and not common_word(match["name"]))
        for match in _INTRODUCED.finditer(text)
    )


def question_personal(text: str, *, names: Iterable[str] = ()) -> bool:
    """Whether a question may not be looked up or stored, by the rule above; `names` are a
    signed-in asker's own (account_names)."""
    text = text.replace("\u2019", "'")
    if _data_found(text) or _addressed_by_name(text) or _introduced(text):
        return True
    words = {word.casefold() for word in _WORD.findall(text)}
    return any(len(name) >= 3 and name.casefold() in words for name in names)


def answer_personal(text: str) -> bool:
    """Whether an answer may not be served, by the rule above."""
    return _data_found(text) or _addressed_by_name(text)


# --- facts an answer must take from its sources ---------------------------------------------------

_LINK = re.compile(
    r"\b(?:https?://|www\.)[^\s<>()\[\]]+"
    r"|\b[\w-]+(?:\.[\w-]+)*\.(?:com|net|org|io|co|shop|store|info|biz|app|dev|uk|de|fr|es|eu|ly)\b(?:/[^\s<>()]*)?",
    re.IGNORECASE,
)
_AMOUNT = re.compile(
    r"[$€£¥]\s?\d[\d,.]*"
    r"|\d[\d,.]*\s?(?:[$€£¥%]|(?:usd|eur|gbp|dollars?|euros?|pounds?|percent|per cent)\b)",
    re.IGNORECASE,
)


def _fact_normalised(text: str) -> str:
    return "".join(text.casefold().split()).rstrip(".,;:!?")


def answer_facts(text: str) -> set[str]:
    """The links, email addresses, phone numbers and amounts an answer states."""
    found = (m.group(0) for pattern in (_LINK, _EMAIL, _PHONE, _AMOUNT) for m in pattern.finditer(text))
    return {_fact_normalised(fact) for fact in found}


def answer_ungrounded(text: str, sources: Iterable[str]) -> bool:
    """Whether an answer states a link, an email address, a phone number or an amount that none
    of its sources' texts holds: a model's invention, or what a crafted question asked it to
    say, which must not be served to anyone else."""
    facts = answer_facts(text)
    if not facts:
        return False
    known = "".join(_fact_normalised(source) for source in sources)
    return any(fact not in known for fact in facts)


def _sharing_network(address: str) -> str:
    """The network one person can easily ask from: a guest from anywhere in an IPv4 /24 or an
    IPv6 /48 is one customer to the count (a home line often holds a /56 of /64s, and
    neighbouring IPv4 addresses are cheap to rent). Wider than the rate limits' scope: a
    planted answer is served to everyone, a rate limit refuses only its own client."""
    scope = address_scope(address)
    try:
        network = ipaddress.ip_network(scope, strict=False)
    except ValueError:
        return scope
    prefix = 24 if network.version == 4 else 48
    return str(network.supernet(new_prefix=prefix)) if network.prefixlen > prefix else str(network)


def customer_key(*, client_id: str, address: str | None = None) -> str:
    """Who a customer is to the count of those given an answer: a guest by the network they ask
    from (`_sharing_network`), since guests' ids cost nothing to make; an account or an API key
    by its id. A keyed hash: the cache stores nothing personal."""
    who = f"address:{_sharing_network(address)}" if address else client_id
    return salted_hmac("knowledge.cache.customer", who, algorithm="sha256").hexdigest()[:16]


def account_names(user) -> list[str]:
    """The names of a signed-in account that its questions must not carry into the cache."""
    if user is None or not user.is_authenticated:
        return []
    names = [user.get_username(), user.first_name, user.last_name, user.email.partition("@")[0]]
    return [part for name in names for part in _WORD.findall(name or "")]


# --- keys ---------------------------------------------------------------------------------------


def question_normalised(text: str) -> str:
    """Case, accents' composed forms, spacing and punctuation do not make another question."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_WORD.findall(text))


def question_hash(text: str) -> str:
    return hashlib.sha256(question_normalised(text).encode()).hexdigest()


def _question_digest(text: str, vector: np.ndarray | None) -> str:
    """The exact-match key: the normalised text's hash, or without a `vector` the text's own."""
    return question_hash(text) if vector is not None else hashlib.sha256(text.encode()).hexdigest()


def _context_hash(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def chat_context(variant: Variant) -> str:
    return _context_hash(
        {
            "recipe": "chat",
            "model": variant.model,
            "system_prompt": variant.system_prompt,
            "knowledge": variant.knowledge,
            "sampling": variant.sampling().to_dict(),
        }
    )


def api_context(variant: Variant, sampling: SamplingParams) -> str:
    return _context_hash({"recipe": "api", "model": variant.model, "sampling": sampling.to_dict()})


# --- the process's index --------------------------------------------------------------------------


@dataclass
class _Shelf:
    """The entries of one (variant, context): exact hashes and a matrix of question vectors,
    grown in place (capacity doubles) so that an entry added costs no copy of the others."""

    ids: list[int] = field(default_factory=list)
    buffer: np.ndarray = field(default_factory=lambda: np.zeros((64, EMBEDDING_DIM), dtype=np.float32))
    count: int = 0
    by_hash: dict[str, list[int]] = field(default_factory=dict)
    pinned: set[int] = field(default_factory=set)

    @property
    def matrix(self) -> np.ndarray:
        return self.buffer[: self.count]

    def append(self, entry_id: int, vector: np.ndarray) -> None:
        if self.count == len(self.buffer):
            grown = np.zeros((2 * len(self.buffer), EMBEDDING_DIM), dtype=np.float32)
            grown[: self.count] = self.buffer
            self.buffer = grown
        self.buffer[self.count] = vector
        self.ids.append(entry_id)
        self.count += 1


class _CacheIndex:
    """Every servable-looking entry of the current knowledge-base version, per (variant,
    context), in memory. Rebuilt when the version moves; new entries are appended once a
    CHECK_S. Whether an entry may really be served is checked in the database on a match."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shelves: dict[tuple[str, str], _Shelf] = {}
        self._version: int | None = None
        self._last_id = 0  # entries up to this id were read from the database
        self._known: set[int] = set()  # read, or added by this process
        self._checked_at = 0.0

    def forget(self) -> None:
        with self._lock:
            self._shelves, self._version, self._last_id, self._checked_at = {}, None, 0, 0.0
            self._known = set()

    def shelf(self, variant: str, context: str) -> _Shelf | None:
        now = time.monotonic()
        if now - self._checked_at >= CHECK_S:
            with self._lock:
                if now - self._checked_at >= CHECK_S:
                    self._refresh()
                    self._checked_at = time.monotonic()
        return self._shelves.get((variant, context))

    def _refresh(self) -> None:
        version = knowledge_base_version()
        if version != self._version:
            self._shelves, self._version, self._last_id, self._known = {}, version, 0, set()
        rows = (
            CachedAnswer.objects.filter(id__gt=self._last_id)
            .filter(models_current(version))
            .order_by("id")
            .values_list("id", "variant", "context", "question_hash", "embedding", "pinned_answer")
        )
        for entry_id, variant, context, digest, embedding, pinned_answer in rows.iterator(chunk_size=2000):
            self._last_id = entry_id
            self._add(entry_id, (variant, context), digest, bytes(embedding), pinned=bool(pinned_answer))

    def _add(
        self, entry_id: int, key: tuple[str, str], digest: str, embedding: bytes, *, pinned: bool
    ) -> None:
        if entry_id in self._known:
            return
        self._known.add(entry_id)
        shelf = self._shelves.setdefault(key, _Shelf())
        shelf.append(entry_id, np.frombuffer(embedding, dtype="<f4"))
        shelf.by_hash.setdefault(digest, []).append(entry_id)
        if pinned:
            shelf.pinned.add(entry_id)

    def add_own(self, entry: CachedAnswer, vector: np.ndarray) -> None:
        """An entry this process just stored: matched here at once, without waiting a check."""
        with self._lock:
            if entry.kb_version == self._version:
                key = (entry.variant, entry.context)
                self._add(entry.id, key, entry.question_hash, vector.tobytes(), pinned=entry.pinned)


def models_current(version: int) -> Q:
    """Entries that may answer under this knowledge-base version: pinned ones always."""
    return Q(kb_version=version) | ~Q(pinned_answer="")


_index = _CacheIndex()


# --- lookups ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a lookup found (`answer` None: a miss), the articles it was written from, and how
    long the lookup took."""

    answer: KnownAnswer | None
    lookup_ms: float
    sources: list[dict[str, str]] = field(default_factory=list)


def _candidates(shelf: _Shelf, digest: str, vector: np.ndarray | None) -> list[tuple[int, str]]:
    """(entry id, how it matched), in the order to try them; exact matches only without a
    `vector`."""
    found: list[tuple[int, str]] = []
    exact = shelf.by_hash.get(digest, [])
    found += [(i, CacheResult.PINNED) for i in exact if i in shelf.pinned]
    found += [(i, CacheResult.EXACT) for i in exact if i not in shelf.pinned]
    matrix = shelf.matrix  # this view's rows stay valid while entries are appended
    if vector is not None and len(matrix):
        # einsum's own loop, not BLAS, as in the retrieval index (knowledge/index.py).
        scores = np.einsum("ij,j->i", matrix, vector)
        count = min(SEMANTIC_CANDIDATES, len(scores))
        best = np.argpartition(scores, -count)[-count:]
        for row in best[np.argsort(scores[best])[::-1]]:
            if scores[row] < settings.ANSWER_CACHE_MIN_SIMILARITY:
                break
            entry_id = shelf.ids[row]
            kind = CacheResult.PINNED if entry_id in shelf.pinned else CacheResult.SEMANTIC
            found.append((entry_id, kind))
    seen: set[int] = set()
    return [(i, kind) for i, kind in found if not (i in seen or seen.add(i))]


def _numbers(text: str) -> list[str]:
    return sorted(_NUMBER.findall(text))


def _servable(
    entries: dict[int, CachedAnswer], candidates: list[tuple[int, str]], question: str
) -> tuple[CachedAnswer, str] | None:
    """The first candidate that may be served, and how it matched."""
    for entry_id, kind in candidates:
        entry = entries.get(entry_id)
        if entry is None:
            continue
        if kind != CacheResult.EXACT and _numbers(entry.question) != _numbers(question):
            continue  # a paraphrase asks about the same numbers, or it is another question
        if entry.pinned:
            return entry, kind
        generation = entry.generation
        if generation is None or generation.status == Generation.Status.PENDING:
            continue  # still being written: the next asker may get it
        good = (
            generation.status == Generation.Status.DONE
            and generation.finish_reason == "stop"
            and generation.text.strip()
            and not answer_personal(generation.text)
            and not answer_ungrounded(generation.text, entry.sources.values_list("body", flat=True))
        )
        if not good:
            entry.delete()  # a failed, cut, personal or ungrounded answer is never served
            continue
        if kind == CacheResult.SEMANTIC and not entry.shared:
            continue  # not yet given to enough customers to answer another wording
        return entry, kind
    return None


def _find(
    *, variant: str, context: str, question: str, vector: np.ndarray | None
) -> tuple[CachedAnswer, str] | None:
    shelf = _index.shelf(variant, context)
    if shelf is None:
        return None
    candidates = _candidates(shelf, _question_digest(question, vector), vector)
    if not candidates:
        return None
    entries = CachedAnswer.objects.select_related("generation").in_bulk([i for i, _ in candidates])
    return _servable(entries, candidates, question)


def _given(entry: CachedAnswer, customer: str) -> None:
    """Count a customer the entry's answer was given to, until it is shared."""
    if entry.pinned or entry.shared or customer in entry.given_to:
        return
    with transaction.atomic():
        given_to = (
            CachedAnswer.objects.select_for_update()
            .filter(pk=entry.pk)
            .values_list("given_to", flat=True)
            .first()
        )
        if given_to is None or customer in given_to:
            return
        entry.given_to = [*given_to, customer][: settings.ANSWER_CACHE_SHARE_AFTER]
        CachedAnswer.objects.filter(pk=entry.pk).update(given_to=entry.given_to)


def answer_lookup(
    *, variant: str, context: str, question: str, vector: np.ndarray | None, customer: str
) -> Lookup:
    """The cached answer to a first-turn question from `customer` (customer_key), if one may be
    served (see the module); by its very text alone without the question's `vector`."""
    started = time.perf_counter()
    found = _find(variant=variant, context=context, question=question, vector=vector)
    if found is not None:
        _given(found[0], customer)
    lookup_ms = round((time.perf_counter() - started) * 1000, 3)
    if found is None:
        cache_metrics.lookup_observe(
            variant=variant, result=CacheResult.MISS, lookup_ms=lookup_ms, saved_engine_ms=0
        )
        return Lookup(None, lookup_ms)
    entry, kind = found
    sources = [{"slug": a.slug, "title": a.title} for a in entry.sources.filter(status=Article.Status.ACTIVE)]
    if entry.pinned:
        served = KnownAnswer(entry.pinned_answer, CACHE, lookup_ms, 0, cache=kind, saved_engine_ms=0.0)
    else:
        generation = entry.generation
        served = KnownAnswer(
            generation.text,
            CACHE,
            lookup_ms,
            generation.completion_tokens or 0,
            cache=kind,
            saved_engine_ms=generation.duration_ms or 0.0,
        )
    cache_metrics.lookup_observe(
        variant=variant, result=kind, lookup_ms=lookup_ms, saved_engine_ms=served.saved_engine_ms
    )
    return Lookup(served, lookup_ms, sources)


# --- writes --------------------------------------------------------------------------------------


def answer_remember(
    *,
    variant: str,
    context: str,
    question: str,
    vector: np.ndarray | None,
    kb_version: int,
    help_center: bool,
    source_slugs: Iterable[str],
    request_id: str,
    customer: str,
) -> CachedAnswer | None:
    """Remember a first-turn question whose answer is being generated; it is served once that
    answer finished well (for this very question, and for paraphrases once shared; `customer`,
    a customer_key, is the first it is given to). None when the answer was written from an
    older knowledge base (an article changed while the prompt was built), or the question is
    already remembered.
    Without its `vector`, the question is matched by its very text only. `help_center`: the
    answer's prompt was built with the help center (answers_invalidate)."""
    digest = _question_digest(question, vector)
    if vector is None:
        vector = np.zeros(EMBEDDING_DIM, dtype=np.float32)  # scores 0: never a semantic match
    with transaction.atomic():
        if knowledge_base_version() != kb_version:
            return None
        if CachedAnswer.objects.filter(
            variant=variant, context=context, question_hash=digest, kb_version=kb_version
        ).exists():
            return None
        entry = CachedAnswer.objects.create(
            variant=variant,
            context=context,
            question=question,
            question_hash=digest,
            embedding=vector.astype("<f4").tobytes(),
            kb_version=kb_version,
            help_center=help_center,
            generation_id=request_id,
            given_to=[customer],
        )
        entry.sources.set(Article.objects.filter(slug__in=list(source_slugs)))
    _index.add_own(entry, vector)
    return entry


def answer_pin(
    *, variant: Variant, question: str, answer: str, pinned_by: str, vector: np.ndarray
) -> CachedAnswer:
    """An answer staff approved for a question (and its paraphrases) in chat on `variant`."""
    entry = CachedAnswer.objects.create(
        variant=variant.name,
        context=chat_context(variant),
        question=question,
        question_hash=question_hash(question),
        embedding=vector.astype("<f4").tobytes(),
        kb_version=knowledge_base_version(),
        pinned_answer=answer,
        pinned_by=pinned_by,
    )
    _index.add_own(entry, vector)
    return entry


def answer_forget(*, request_id: str) -> None:
    """Drop the entry of an answer the asker rated down: it is never served again."""
    CachedAnswer.objects.filter(generation_id=request_id).delete()


def answer_forget_served(*, variant: Variant, question: str, vector: np.ndarray) -> None:
    """A cached answer to `question` was rated down: drop the generated entry it came from
    (the one the question finds now). A pinned answer stays: staff approved it."""
    found = _find(variant=variant.name, context=chat_context(variant), question=question, vector=vector)
    if found is not None and not found[0].pinned:
        found[0].delete()


def answers_invalidate(*, article: Article, passages: np.ndarray, new_version: int) -> int:
    """Called in the transaction of an article change that raises the version to
    `new_version`; `passages`: the embeddings of the article's chunks before and after it.

    A cached answer must never contradict the help center as it is now. An answer written with
    the help center saw the excerpts retrieval picked for its question: the chunks scoring at
    least KNOWLEDGE_MIN_SCORE. If none of the article's passages, old or new, scores that much
    against the question, the excerpts, and so the prompt, are what they would be now: the
    entry is carried to the new version. Otherwise (the article fed it, or now has something
    on it) it is dropped. Entries written without the help center (/v1, variants with it off)
    never read an article and are all carried; pinned ones outlive edits. Returns how many
    were dropped."""
    current = CachedAnswer.objects.filter(pinned_answer="", kb_version=new_version - 1)
    doomed = set(current.filter(sources=article).values_list("pk", flat=True))
    if len(passages):
        rows = current.filter(help_center=True).values_list("pk", "embedding")
        for entry_id, embedding in rows.iterator(chunk_size=2000):
            scores = np.einsum("ij,j->i", passages, np.frombuffer(embedding, dtype="<f4"))
            if scores.max() >= settings.KNOWLEDGE_MIN_SCORE:
                doomed.add(entry_id)
    _, deleted = CachedAnswer.objects.filter(pk__in=doomed).delete()
    current.update(kb_version=new_version)
    # Entries of older versions (a question remembered while an article changed) never answer.
    CachedAnswer.objects.filter(pinned_answer="", kb_version__lt=new_version).delete()
    transaction.on_commit(_index.forget)
    return deleted.get(CachedAnswer._meta.label, 0)
