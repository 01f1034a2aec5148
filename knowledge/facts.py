"""The checkable facts of a sentence, and whether a text supports them: what the grounding check
(knowledge.grounding) holds every answer sentence to, and what the quality score counts as an
invented fact.

A fact is what a customer would act on and a help center states exactly: an amount, a
percentage, a duration, any other number (a count, a time of day, a date), an email address,
a phone number, a link, or a name (a capitalised word that is not a common one: a program, a
brand, a place). Each is normalised so that the same fact written two ways is equal ("$1,000"
and "1000 $"; "two weeks" and "14 days"; "30 jours" and "30 days"; "10 %" and "10 percent"), in
English, French, Spanish and German. No model is needed, and a check costs well under a
millisecond a sentence.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from knowledge.language import asking_word

# --- words ---------------------------------------------------------------------------------------

# Number words that count as a number only before a unit ("two weeks", "un an"): alone, "one"
# or "une" is far more often a pronoun or an article than a fact.
_NUMBER_WORDS = {
    **dict.fromkeys(
        ("one", "a", "an", "un", "une", "uno", "una", "ein", "eine", "einen", "einem", "einer"), 1
    ),
    **dict.fromkeys(("two", "deux", "dos", "zwei"), 2),
    **dict.fromkeys(("three", "trois", "tres", "drei"), 3),
    **dict.fromkeys(("four", "quatre", "cuatro", "vier"), 4),
    **dict.fromkeys(("five", "cinq", "cinco", "fünf", "funf"), 5),
    **dict.fromkeys(("six", "seis", "sechs"), 6),
    **dict.fromkeys(("seven", "sept", "siete", "sieben"), 7),
    **dict.fromkeys(("eight", "huit", "ocho", "acht"), 8),
    **dict.fromkeys(("nine", "neuf", "nueve", "neun"), 9),
    **dict.fromkeys(("ten", "dix", "diez", "zehn"), 10),
    **dict.fromkeys(("eleven", "onze", "once", "elf"), 11),
    **dict.fromkeys(("twelve", "douze", "doce", "zwölf", "zwolf"), 12),
    **dict.fromkeys(("fourteen", "quatorze", "catorce", "vierzehn"), 14),
    **dict.fromkeys(("fifteen", "quinze", "quince", "fünfzehn"), 15),
    **dict.fromkeys(("twenty", "vingt", "veinte", "zwanzig"), 20),
    **dict.fromkeys(("thirty", "trente", "treinta", "dreißig", "dreissig"), 30),
    **dict.fromkeys(("sixty", "soixante", "sesenta", "sechzig"), 60),
}
_WORD_NUMBER = "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))

# Units of time, each with its length in its base unit (days for calendar time, hours for the
# clock): "2 weeks" is the fact "14 days". Business days are days of their own.
_UNITS: dict[str, tuple[str, Decimal]] = {}
for _names, _base, _factor in (
    ("minute minutes min mins minuto minutos minuten", "minute", 1),
    ("hour hours hr hrs heure heures h hora horas stunde stunden std", "hour", 1),
    ("day days jour jours journée journées día días dia dias tag tage tagen", "day", 1),
    (
        "business day|business days|working day|working days|jour ouvré|jours ouvrés|jour ouvrable"
        "|jours ouvrables|día hábil|días hábiles|dia habil|dias habiles|día laborable|días laborables"
        "|werktag|werktage|werktagen|arbeitstag|arbeitstage|arbeitstagen",
        "business-day",
        1,
    ),
    ("week weeks semaine semaines semana semanas woche wochen", "day", 7),
    ("month months mois mes meses monat monate monaten", "month", 1),
    ("year years an ans année années año años jahr jahre jahren", "month", 12),
):
    for _name in _names.split("|") if "|" in _names else _names.split():
        _UNITS[_name] = (_base, Decimal(_factor))
_UNIT = "|".join(sorted((re.escape(name) for name in _UNITS), key=len, reverse=True))

_NEGATIONS = frozenset(
    [
        "not",
        "no",
        "never",
        "cannot",
        "can't",
        "don't",
        "doesn't",
        "won't",
        "isn't",
        "aren't",
        "wasn't",
        "weren't",
        "without",
        "none",
        "nothing",
        "ne",
        "n'",
        "pas",
        "jamais",
        "aucun",
        "aucune",
        "sans",
        "rien",
        "ni",
        "nunca",
        "ningún",
        "ninguna",
        "ninguno",
        "sin",
        "nada",
        "tampoco",
        "nicht",
        "kein",
        "keine",
        "keinen",
        "keinem",
        "keiner",
        "keines",
        "nie",
        "niemals",
        "ohne",
        "nichts",
    ]
)

# --- patterns ------------------------------------------------------------------------------------

_NUM = r"\d{1,3}(?:[,.\u00a0 ]\d{3})+(?:[.,]\d{1,2})?|\d+(?:[.,]\d+)?"
_AMOUNT = re.compile(
    rf"(?:(?:US)?\$|USD\s?|€|£)\s?(?P<a>{_NUM})|(?P<b>{_NUM})\s?(?:\$|USD|€|£|dollars?|dólares|dollar)",
    re.IGNORECASE,
)
_PERCENT = re.compile(
    rf"(?P<n>{_NUM})\s?(?:%|percent|per cent|pour ?cent|por ?ciento|prozent)", re.IGNORECASE
)
_DURATION = re.compile(
    rf"(?<![\w.,])(?P<n>{_NUM}|{_WORD_NUMBER})"
    rf"(?:\s?(?:(?:to|à|a|bis|-|\u2013|y|and|et|und|or|ou|o|oder)\s?(?P<m>{_NUM}|{_WORD_NUMBER})))?"
    rf"[\s-]?(?P<unit>{_UNIT})(?!\w)",
    re.IGNORECASE,
)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_URL = re.compile(r"https?://[^\s)>\]]+|www\.[^\s)>\]]+", re.IGNORECASE)
_PHONE = re.compile(r"\+?\d(?:[\s().-]*\d){6,}")
_NUMBER = re.compile(rf"(?<![\w.,])(?:{_NUM})(?![\w])|\d+")
_WORD = re.compile(r"[^\W\d_][\w'\u2019-]*")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;]\s+|\n\s*(?:[-*•]\s+|\d+\.\s+)?|[\"“«(¿¡]\s*)$")


@dataclass(frozen=True, slots=True, order=True)
class Fact:
    """`kind`: amount, percent, duration, number, email, phone, link or name; `value` is the
    normalised fact (equal for the same fact however written); `text` as written."""

    kind: str
    value: str
    text: str = ""

    def key(self) -> tuple[str, str]:
        return self.kind, self.value


def _plain(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'")


def _number(raw: str) -> Decimal | None:
    """'1,000' / '1.000' / '1 000' -> 1000; '5.95' / '5,95' -> 5.95."""
    raw = raw.replace("\u00a0", " ").strip()
    if raw.lower() in _NUMBER_WORDS:
        return Decimal(_NUMBER_WORDS[raw.lower()])
    grouped = re.fullmatch(r"(\d{1,3}(?:[,. ]\d{3})+)(?:([.,])(\d{1,2}))?", raw)
    if grouped:
        whole = re.sub(r"[,. ]", "", grouped.group(1))
        return Decimal(f"{whole}.{grouped.group(3)}" if grouped.group(3) else whole)
    try:
        return Decimal(raw.replace(",", "."))
    except InvalidOperation:
        return None


def _normal(value: Decimal) -> str:
    value = value.normalize()
    return format(value, "f")


def facts(text: str) -> list[Fact]:
    """Every fact of `text`, in order of appearance (a number inside an amount, a percentage or
    a duration is that fact, not a number of its own)."""
    text = _plain(text)
    found: list[tuple[int, Fact]] = []
    taken: list[tuple[int, int]] = []

    def free(start: int, end: int) -> bool:
        return all(end <= a or start >= b for a, b in taken)

    def add(match: re.Match[str], fact: Fact) -> None:
        found.append((match.start(), fact))
        taken.append(match.span())

    for match in _EMAIL.finditer(text):
        add(match, Fact("email", match.group().lower().rstrip("."), match.group()))
    for match in _URL.finditer(text):
        if free(*match.span()):
            url = re.sub(r"^https?://(www\.)?|^www\.", "", match.group().lower()).rstrip("/.,;")
            add(match, Fact("link", url, match.group()))
    for match in _AMOUNT.finditer(text):
        number = _number(match.group("a") or match.group("b"))
        if number is not None and free(*match.span()):
            add(match, Fact("amount", _normal(number), match.group()))
    for match in _PERCENT.finditer(text):
        number = _number(match.group("n"))
        if number is not None and free(*match.span()):
            add(match, Fact("percent", _normal(number), match.group()))
    for match in _PHONE.finditer(text):
        digits = re.sub(r"\D", "", match.group())
        if len(digits) >= 7 and free(*match.span()) and not re.fullmatch(r"\d{1,4}", match.group()):
            add(
                match, Fact("phone", digits.removeprefix("1") if len(digits) == 11 else digits, match.group())
            )
    for match in _DURATION.finditer(text):
        if not free(*match.span()):
            continue
        base, factor = _UNITS[match.group("unit").lower()]
        low = _number(match.group("n"))
        high = _number(match.group("m")) if match.group("m") else None
        if low is None:
            continue
        value = _normal(low * factor) + (f"-{_normal(high * factor)}" if high is not None else "")
        add(match, Fact("duration", f"{value} {base}", match.group()))
    for match in _NUMBER.finditer(text):
        if free(*match.span()):
            number = _number(match.group())
            if number is not None:
                add(match, Fact("number", _normal(number), match.group()))
    for match in _WORD.finditer(text):
        word = match.group()
        if not word[0].isupper() or not free(*match.span()) or asking_word(word) or len(word) < 2:
            continue
        if _SENTENCE_START.search(text[: match.start()]):
            continue  # a capital that only starts a sentence or an item says nothing
        found.append((match.start(), Fact("name", _fold(word), word)))
    found.sort(key=lambda pair: pair[0])
    return [fact for _, fact in found]


def _fold(word: str) -> str:
    """Lower case without accents: 'Réduction' and 'reduction' are one word."""
    decomposed = unicodedata.normalize("NFKD", word.lower())
    return "".join(char for char in decomposed if not unicodedata.combining(char)).replace("ß", "ss")


def words(text: str) -> list[str]:
    """The words of `text`, folded (lower case, no accents)."""
    return [_fold(word) for word in _WORD.findall(_plain(text))]


def negated(text: str) -> bool:
    """Whether `text` holds a negation in any of the four languages."""
    folded = _plain(text).lower()
    return any(word in _NEGATIONS for word in re.findall(r"[\w']+", folded)) or "n'" in folded


def fact_values(text: str) -> set[tuple[str, str]]:
    """The normalised facts of `text`, and each number inside them as a number too (so that a
    duration "3 to 5 business days" supports the number 5, and the amount "$50" the number 50)."""
    values: set[tuple[str, str]] = set()
    for fact in facts(text):
        values.add(fact.key())
        if fact.kind in {"amount", "percent"}:
            values.add(("number", fact.value))
        elif fact.kind == "duration":
            amount, unit = fact.value.split(" ")
            for part in amount.split("-"):
                values.add(("number", part))
                values.add(("duration", f"{part} {unit}"))
    for word in words(text):
        values.add(("name", word))
    return values


def supported(fact: Fact, support: set[tuple[str, str]]) -> bool:
    """Whether `support` (fact_values of the sources) holds `fact`. A duration is supported by
    the same length in any unit ("2 weeks" by "14 days"); a range by each of its ends; a bare
    number by any fact holding that number ("30" by "30 days")."""
    if fact.key() in support:
        return True
    if fact.kind == "duration":
        amount, unit = fact.value.split(" ")
        return all(("duration", f"{part} {unit}") in support for part in amount.split("-"))
    if fact.kind == "number":
        return ("number", fact.value) in support
    if fact.kind == "phone":
        return any(
            kind == "phone" and (fact.value in value or value in fact.value) for kind, value in support
        )
    return False


# The facts a customer acts on and that are written the same in every language; names are
# checked apart (German capitalises every noun, so a capital says less there).
EXACT_KINDS = frozenset({"amount", "percent", "duration", "number", "email", "phone", "link"})


def unsupported_facts(text: str, sources: list[str], *, kinds: frozenset[str] = EXACT_KINDS) -> list[Fact]:
    """The facts of `text` of the given kinds that none of `sources` holds."""
    support: set[tuple[str, str]] = set()
    for source in sources:
        support |= fact_values(source)
    return [fact for fact in facts(text) if fact.kind in kinds and not supported(fact, support)]
