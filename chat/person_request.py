"""Whether a customer's message asks for a person rather than an answer ("can I talk to a
human?", "un conseiller, s'il vous plaît"), in English, French, Spanish and German.

Small on purpose: a message that mentions people while asking something else ("is a human
checking returns?", "I need someone to sign for my parcel") goes to the assistant, which offers
a person when it cannot help; a message that asks to talk to one, or is little more than the
request itself ("agent", "real person please"), hands off at once.
"""

from __future__ import annotations

import re
import unicodedata

# Words for a person from the team, each language's (accents folded away: see _folded).
_PERSON = {
    "en": r"(?:a\s+|an\s+)?(?:real\s+|actual\s+|live\s+)?(?:human(?:\s+being)?|person|agent|operator"
    r"|representative|rep|staff(?:\s+member)?|customer\s+service|support\s+team)",
    "fr": r"(?:un\s+|une\s+)?(?:vrai\s+|vraie\s+)?(?:humain|humaine|personne(?:\s+reelle)?|conseiller"
    r"|conseillere|agent|operateur|operatrice|service\s+client)",
    "es": r"(?:un\s+|una\s+)?(?:humano|persona(?:\s+real)?|agente|asesor|asesora|operador|operadora"
    r"|atencion\s+al\s+cliente)",
    "de": r"(?:einen\s+|einem\s+|eine\s+|einer\s+)?(?:echten\s+|richtigen\s+|echte\s+)?(?:mensch|menschen"
    r"|person|mitarbeiter|mitarbeiterin|berater|beraterin|agenten?|kundendienst|kundenservice)",
}
# "Someone" counts only after a verb of talking: "I need someone to sign for it" is a question.
_SOMEONE = {
    "en": r"(?:a\s+)?(?:real\s+)?(?:someone|somebody)(?:\s+real)?",
    "fr": r"quelqu'?un(?:\s+de\s+reel)?",
    "es": r"alguien(?:\s+real)?",
    "de": r"jemand(?:em|en)?(?:\s+echtem)?",
}
# Ways of asking to talk to one.
_TALK = {
    "en": r"(?:talk|speak|chat)\s+(?:to|with)\s+",
    "fr": r"(?:parler|discuter)\s+(?:a|avec)\s+",
    "es": r"(?:hablar|comunicarme)\s+con\s+",
    "de": r"(?:sprechen|reden)\s+mit\s+",
}
_ASK = {
    "en": r"(?:connect\s+me\s+(?:to|with)|put\s+me\s+through\s+to|transfer\s+me\s+to|get\s+me"
    r"|i\s+(?:want|need)|i\s+would\s+like|i'?d\s+like|can\s+i\s+(?:get|have))\s+",
    "fr": r"(?:je\s+(?:veux|voudrais|souhaite)|passez[- ]moi|mettez[- ]moi\s+en\s+relation\s+avec)\s+",
    "es": r"(?:quiero|quisiera|necesito|paseme|pasame|comuniqueme\s+con)\s+",
    "de": r"(?:ich\s+(?:will|mochte|moechte|brauche)|verbinden\s+sie\s+mich\s+mit|kann\s+ich)\s+",
}
_POLITE = r"(?:please|plz|now|s'il\s+(?:vous|te)\s+plait|svp|por\s+favor|bitte|sofort|jetzt|merci|thanks)"

_PATTERNS = [
    pattern
    for lang in _PERSON
    for pattern in (
        # "can I speak to a real person", "je voudrais parler à un conseiller", "hablar con alguien".
        re.compile(rf"\b{_TALK[lang]}(?:{_PERSON[lang]}|{_SOMEONE[lang]})\b"),
        # "I want a human", "quiero un agente", "passez-moi un conseiller".
        re.compile(rf"\b{_ASK[lang]}{_PERSON[lang]}\b"),
        # The bare request: "agent", "human please", "¡un humano!", "Mensch bitte".
        re.compile(rf"^\W*(?:{_POLITE}\W+)?{_PERSON[lang]}(?:\W+{_POLITE})?\W*$"),
    )
]
# German puts the verb last: "ich möchte mit einem Menschen sprechen", "kann ich mit jemandem reden".
_PATTERNS.append(re.compile(rf"\bmit\s+(?:{_PERSON['de']}|{_SOMEONE['de']})\s+(?:sprechen|reden)\b"))

# A long message is a question, whatever words it holds.
_MAX_CHARS = 200


def _folded(text: str) -> str:
    """Lower case without accents: "à" and "a", "atención" and "atencion", "möchte" and
    "mochte" match alike."""
    decomposed = unicodedata.normalize("NFKD", text.replace("\N{RIGHT SINGLE QUOTATION MARK}", "'").lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def asks_for_person(text: str) -> bool:
    folded = _folded(text.strip())
    if len(folded) > _MAX_CHARS:
        return False
    return any(pattern.search(folded) for pattern in _PATTERNS)
