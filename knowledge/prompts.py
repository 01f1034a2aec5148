"""The system prompt an answer is written under: the assistant's own prompt, plus what the help
center says about the customer's message, or the reply when it has nothing. The chat and the
quality score build them here, so the score measures what customers get."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np

from knowledge.language import text_language
from knowledge.selectors import EmbedderUnavailable, Source, help_center_excerpts

logger = logging.getLogger(__name__)

# The help center decides what the assistant may say: a small model asked without it invents
# policies, and one told to keep to excerpts still needs to be told what to do without any.
HELP_CENTER_PROMPT = (
    "Answer only from these excerpts of our help center. If they do not answer the question, "
    "say that you do not know, and offer to put the customer in touch with a person from our "
    "team or ask what exactly they need. Never make up policies, prices or dates.\n\n{excerpts}"
)
NO_HELP_CENTER_MATCH_PROMPT = (
    "Our help center has nothing on this message. If it is a greeting or thanks, reply briefly. "
    "Otherwise say that you do not know, and offer to put the customer in touch with a person "
    "from our team or ask what exactly they need. Never make up policies, prices or dates."
)


# What the assistant replies, without the model, to a conversation's first question that the
# help center has nothing on (a variant's `unknown_reply`): a small model told to say it does
# not know invents a policy more often than not. In the customer's language where it is one of
# these (knowledge.language), else in English.
UNKNOWN_REPLIES = {
    "en": "I couldn't find anything about this in our help center, and I'd rather not guess. Could "
    "you tell me a little more about what you need, for example about an order, a delivery, a "
    "return or a payment? I can also put you in touch with a person from our team.",
    "fr": "Je n'ai rien trouvé à ce sujet dans notre centre d'aide, et je préfère ne pas deviner. "
    "Pouvez-vous m'en dire un peu plus sur ce dont vous avez besoin, par exemple une commande, une "
    "livraison, un retour ou un paiement ? Je peux aussi vous mettre en contact avec une personne "
    "de notre équipe.",
    "es": "No he encontrado nada sobre esto en nuestro centro de ayuda, y prefiero no adivinar. "
    "¿Puede contarme un poco más sobre lo que necesita, por ejemplo sobre un pedido, una entrega, "
    "una devolución o un pago? También puedo ponerle en contacto con una persona de nuestro equipo.",
    "de": "Dazu habe ich in unserem Hilfe-Center leider nichts gefunden, und ich möchte nicht raten. "
    "Können Sie mir etwas mehr darüber sagen, was Sie brauchen, zum Beispiel zu einer Bestellung, "
    "einer Lieferung, einer Rücksendung oder einer Zahlung? Ich kann Sie auch mit einer Person aus "
    "unserem Team verbinden.",
}


# A message made only of greetings, thanks and pleasantries needs no fact from the help center:
# the model greets back (NO_HELP_CENTER_MATCH_PROMPT) rather than the customer hearing that we
# know nothing about "Hi". Anything more ("Hi, do you have a shop in Paris?") is a question.
_SMALL_TALK_PHRASES = (
    r"hi|hello|hey|hiya|howdy|greetings|good (?:morning|afternoon|evening|day)|there|everyone"
    r"|thanks?(?: you)?(?: (?:so|very) much)?|thx|cheers|how are you(?: doing)?(?: today)?"
    r"|how's it going|(?:are you|is any ?one) there|ok(?:ay)?|bye|goodbye|have a (?:nice|good) day"
    r"|bonjour|bonsoir|salut|coucou|merci(?: beaucoup)?|ça va|comment (?:allez-vous|ça va)|au revoir"
    r"|bonne journée|hola|buen(?:os|as) (?:días|tardes|noches)|buenas|(?:muchas )?gracias|qué tal"
    r"|cómo (?:estás|está)|adiós|hasta luego|hallo|guten (?:morgen|tag|abend)|servus|moin"
    r"|danke(?: schön| sehr)?|wie geht's|wie geht es ihnen|tschüss|auf wiedersehen"
)
_SMALL_TALK = re.compile(rf"(?:\W*\b(?:{_SMALL_TALK_PHRASES})\b)+\W*", re.IGNORECASE)
SMALL_TALK_MAX_CHARS = 80  # longer is never only a greeting, and the pattern is not run on it


def small_talk(message: str) -> bool:
    """Whether `message` is only a greeting, thanks or pleasantry, in one of the four languages."""
    message = message.strip().replace("\u2019", "'")
    return len(message) <= SMALL_TALK_MAX_CHARS and _SMALL_TALK.fullmatch(message) is not None


def unknown_reply(question: str) -> str:
    return UNKNOWN_REPLIES.get(text_language(question) or "en", UNKNOWN_REPLIES["en"])


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    text: str
    excerpt_chars: int  # characters of help-center excerpts in `text`
    sources: tuple[Source, ...]  # the articles quoted, best first
    kb_version: int | None = None  # the knowledge base searched; None: not searched
    # The help center has articles, none is relevant enough, and the message asks for something
    # (it is not small talk): what a variant's `unknown_reply` answers.
    found_nothing: bool = False


def system_prompt_build(
    *,
    question: str,
    assistant_prompt: str,
    use_help_center: bool = True,
    vector: np.ndarray | None = None,
) -> SystemPrompt:
    """The system prompt for `question`: `assistant_prompt`, then the help center's excerpts on
    it (or what to do when it has none). Without the help center, `assistant_prompt` alone.
    `vector`: the question's embedding, if already made."""
    if not use_help_center:
        return SystemPrompt(assistant_prompt, 0, ())
    try:
        found = help_center_excerpts(question=question, vector=vector)
    except EmbedderUnavailable:
        logger.warning("Answering without the help center: its embedding model is not prepared")
        return SystemPrompt(assistant_prompt, 0, ())
    if not found.excerpts:
        return SystemPrompt(
            f"{assistant_prompt}\n\n{NO_HELP_CENTER_MATCH_PROMPT}",
            0,
            (),
            found.version,
            found_nothing=found.searched and not small_talk(question),
        )
    excerpts = "\n\n".join(
        f"## {excerpt.source.title}{f' / {excerpt.heading}' if excerpt.heading else ''}\n{excerpt.text}"
        for excerpt in found.excerpts
    )
    return SystemPrompt(
        text=f"{assistant_prompt}\n\n{HELP_CENTER_PROMPT.format(excerpts=excerpts)}",
        excerpt_chars=sum(len(excerpt.text) for excerpt in found.excerpts),
        sources=found.sources,
        kb_version=found.version,
    )
