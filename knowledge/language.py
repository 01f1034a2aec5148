"""Which of the languages the help center answers in a text is written in: told from its most
common short words, which is enough for a question or a few sentences of English, French,
Spanish or German, and needs no model. The same lists tell which words of a question carry its
subject (knowledge.terms): the others are grammar or the way customers ask."""

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
# Words a question is asked with rather than about ("how long", "can I", "est-ce que"): never
# what it is about.
_ASKING_WORDS = {
    "en": "a about after again all also am an any anything are as ask at be because been before being "
    "but by can could did do does doing done each else ever every for get gets getting give go goes "
    "going got had has have having he her here hers him his how however i i'd i'll i'm i've if in "
    "into is isn't it it's its just know let like long many may me might more most much must my "
    "need needs new no not now of off ok okay on once one only or other our out over own please "
    "right same say see she should so some something still such sure tell than thank thanks that "
    "that's the their them then there there's these they they're thing things this those though "
    "through to too two under until up us use very want wants was we we're well were what what's "
    "when where whether which while who whom whose why will with would yes yet you you're your "
    "hi hello hey dear hey there yours way any really actually already soon time",
    "fr": "à au aux avec avoir bonjour c'est ça ce cela ces cet cette chez combien comme comment "
    "dans de des dois doit donc du elle en encore est est-ce et être faire fait faut il ils j'ai "
    "je jusqu'à l'on la le les leur lui ma mais me merci mes moi mon même n'est ne ni nos notre "
    "nous on ou où par pas peut peux plus pour pourquoi puis puis-je qu'est-ce que quel quelle "
    "quelles quels qui quoi sa salut sans se ses si son sont sur ta te tes toi ton tout tous très "
    "tu un une vos votre vous y oui non bien alors déjà j'ai jai reçu recu quoi fais fait "
    "aujourd'hui hier demain encore autre autres beaucoup peu",
    "es": "a al algo alguien así cómo como con cuál cuáles cuándo cuando cuánto cuánta cuántos "
    "cuántas de del donde dónde el él ella en entonces es esa ese eso esta está este esto estoy "
    "gracias hay hola la las le les lo los me mi mis muy más nada ni no nos nuestro o os para pero "
    "por porque puedo puede pueden qué que quiero quién se ser si sí sin sobre su sus también te "
    "tengo tiene tienen tu tú un una uno usted ustedes y ya yo hacer hago favor bien hacen "
    "compré compre tarda llega llegar ahora hoy ayer mañana otra otro mucho poco mío mía",
    "de": "aber alle als am an auch auf aus bei bin bis bitte da dann das dass dem den der des die "
    "dir du ein eine einem einen einer es für gibt hallo hat habe haben ich ihr ihre im in ist ja "
    "kann kannst können man mein meine mich mir mit muss nach nein nicht noch nur ob oder sich sie "
    "sind so soll über um und uns unser vom von vor was warum wie wieso wo wer wann welche welcher "
    "werde werden wird wir zu zum zur danke gut schon kann einen einer anderen andere anderes "
    "meinem meinen meiner euch eure euer ihnen mich möchte möchten würde hätte gerne etwas "
    "wieder nochmal jetzt heute gestern morgen gleich ganz",
}
_STOPWORDS = {language: frozenset(words.split()) for language, words in _COMMON_WORDS.items()}
_ASKING = frozenset(word for words in _ASKING_WORDS.values() for word in words.split())
_WORD = re.compile(r"\w+", re.UNICODE)


def common_word(word: str) -> bool:
    """Whether `word` is one of the common words of any of these languages (never a name)."""
    return any(word.lower() in common for common in _STOPWORDS.values())


def asking_word(word: str) -> bool:
    """Whether `word` is grammar or the way a question is asked, in any of the four languages,
    rather than what it is about."""
    word = word.lower().replace("\u2019", "'")
    return word in _ASKING or common_word(word)


# Each language's own words: its common and asking words that no other of the four has.
_OWN_WORDS = {
    language: frozenset(
        word
        for word in (_COMMON_WORDS[language] + " " + _ASKING_WORDS[language]).split()
        if not any(
            word in (_COMMON_WORDS[other] + " " + _ASKING_WORDS[other]).split()
            for other in LANGUAGES
            if other != language
        )
    )
    for language in LANGUAGES
}
# Letters and marks only one of them writes.
_OWN_LETTERS = {"fr": "çœèêàùâîôûëï", "es": "ñ¿¡áíóú", "de": "ßäöü"}


def text_language(text: str) -> str | None:
    """The language whose own words and letters the text uses most (a letter only one of them
    writes counts twice), or None when none of them shows, or two tie."""
    words = [word.lower() for word in _WORD.findall(text)]
    counts = {language: sum(word in _OWN_WORDS[language] for word in words) for language in LANGUAGES}
    lowered = text.lower()
    for language, letters in _OWN_LETTERS.items():
        counts[language] += 2 * sum(lowered.count(letter) for letter in letters)
    ranked = sorted(counts.values(), reverse=True)
    if ranked[0] == 0 or ranked[0] == ranked[1]:
        return None
    return max(counts, key=lambda language: counts[language])
