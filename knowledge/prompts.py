"""What the assistant says in its own words: the prompt a model answers under (the variant's
system prompt and the help center's rules; the excerpts found for a question, given with it),
and the replies written here rather than by a model: the honest decline, with the offer of a
person from the team, and the greeting. Each in the customer's language (English, French,
Spanish or German)."""

from __future__ import annotations

import re

from knowledge.selectors import Excerpt

# The help center decides what the assistant may say: a small model asked without it invents
# policies, and one told to keep to excerpts still needs to be told what to do without any.
# The rules are the same every turn, so they stay in the system message; the excerpts change
# with each question, so they come with it, after the conversation: a turn's prompt then
# starts with the whole of the previous turn's, which the worker that answered it has cached.
HELP_CENTER_PROMPT = (
    "Answer only from the excerpts of our help center given with the customer's question, in "
    "one to three short sentences, in the customer's language. Give the exact figures they "
    "state. If they do not answer the question, say that you do not know. Never make up "
    "policies, prices or dates."
)
QUESTION_WITH_EXCERPTS = "Help center excerpts:\n\n{excerpts}\n\nCustomer question: {question}"
NO_HELP_CENTER_MATCH_PROMPT = (
    "Our help center has nothing on this message. If it is a greeting or thanks, reply briefly. "
    "Otherwise say that you do not know, and offer to put the customer in touch with a person "
    "from our team. Never make up policies, prices or dates."
)

# The honest decline: what the assistant replies, without a model, when the help center does
# not answer a message (knowledge.declines). It ends with the offer of a person, which the chat
# page shows as a button.
DECLINES = {
    "en": "I couldn't find this in our help center, and I'd rather not guess. Could you tell me a "
    "little more about what you need, for example about an order, a delivery, a return or a "
    "payment? I can also put you in touch with a person from our team.",
    "fr": "Je n'ai pas trouvé cela dans notre centre d'aide, et je préfère ne pas deviner. "
    "Pouvez-vous m'en dire un peu plus sur ce dont vous avez besoin, par exemple une commande, une "
    "livraison, un retour ou un paiement ? Je peux aussi vous mettre en contact avec une personne "
    "de notre équipe.",
    "es": "No he encontrado esto en nuestro centro de ayuda, y prefiero no adivinar. ¿Puede "
    "contarme un poco más sobre lo que necesita, por ejemplo sobre un pedido, una entrega, una "
    "devolución o un pago? También puedo ponerle en contacto con una persona de nuestro equipo.",
    "de": "Dazu habe ich in unserem Hilfe-Center nichts gefunden, und ich möchte nicht raten. "
    "Können Sie mir etwas mehr darüber sagen, was Sie brauchen, zum Beispiel zu einer Bestellung, "
    "einer Lieferung, einer Rücksendung oder einer Zahlung? Ich kann Sie auch mit einer Person aus "
    "unserem Team verbinden.",
}
# A question about one order's own state: no article knows it, a person can look it up.
ONE_ORDER_DECLINES = {
    "en": "I can't look up a single order from here. A person from our team can check it for "
    "you: I can put you in touch with them.",
    "fr": "Je ne peux pas consulter une commande en particulier d'ici. Une personne de notre "
    "équipe peut la vérifier pour vous : je peux vous mettre en contact avec elle.",
    "es": "Desde aquí no puedo consultar un pedido concreto. Una persona de nuestro equipo puede "
    "revisarlo por usted: puedo ponerle en contacto con ella.",
    "de": "Eine einzelne Bestellung kann ich von hier aus nicht nachsehen. Eine Person aus unserem "
    "Team kann sie für Sie prüfen: Ich kann Sie mit ihr verbinden.",
}
GREETINGS = {
    "en": "Hello! How can I help you? You can ask me about orders, delivery, returns, refunds and payments.",
    "fr": "Bonjour ! Comment puis-je vous aider ? Vous pouvez me poser vos questions sur les "
    "commandes, la livraison, les retours, les remboursements et les paiements.",
    "es": "¡Hola! ¿En qué puedo ayudarle? Puede preguntarme sobre pedidos, entregas, devoluciones, "
    "reembolsos y pagos.",
    "de": "Hallo! Wie kann ich Ihnen helfen? Sie können mich zu Bestellungen, Lieferungen, "
    "Rücksendungen, Erstattungen und Zahlungen fragen.",
}
THANKS = {
    "en": "You're welcome! Is there anything else I can help you with?",
    "fr": "Avec plaisir ! Puis-je vous aider pour autre chose ?",
    "es": "¡De nada! ¿Puedo ayudarle con algo más?",
    "de": "Gern geschehen! Kann ich Ihnen sonst noch helfen?",
}

# A message made only of greetings, thanks and pleasantries needs no fact from the help center:
# the assistant greets back rather than the customer hearing that we know nothing about "Hi".
# Anything more ("Hi, do you have a shop in Paris?") is a question.
_THANKS_PHRASES = (
    r"thanks?(?: you)?(?: (?:so|very) much)?|thx|cheers|merci(?: beaucoup)?|(?:muchas )?gracias"
    r"|danke(?: schön| sehr)?|great|perfect|parfait|perfecto|super|prima"
)
_SMALL_TALK_PHRASES = (
    r"hi|hello|hey|hiya|howdy|greetings|good (?:morning|afternoon|evening|day)|there|everyone"
    r"|how are you(?: doing)?(?: today)?"
    r"|how's it going|(?:are you|is any ?one) there|ok(?:ay)?|bye|goodbye|have a (?:nice|good) day"
    r"|bonjour|bonsoir|salut|coucou|ça va|comment (?:allez-vous|ça va)|au revoir"
    r"|bonne journée|hola|buen(?:os|as) (?:días|tardes|noches)|buenas|qué tal"
    r"|cómo (?:estás|está)|adiós|hasta luego|hallo|guten (?:morgen|tag|abend)|servus|moin"
    r"|wie geht's|wie geht es ihnen|tschüss|auf wiedersehen|" + _THANKS_PHRASES
)
_SMALL_TALK = re.compile(rf"(?:\W*\b(?:{_SMALL_TALK_PHRASES})\b)+\W*", re.IGNORECASE)
_THANKS = re.compile(rf"\b(?:{_THANKS_PHRASES})\b", re.IGNORECASE)
SMALL_TALK_MAX_CHARS = 80  # longer is never only a greeting, and the pattern is not run on it


def small_talk(message: str) -> bool:
    """Whether `message` is only a greeting, thanks or pleasantry, in one of the four languages."""
    message = message.strip().replace("\u2019", "'")
    return len(message) <= SMALL_TALK_MAX_CHARS and _SMALL_TALK.fullmatch(message) is not None


def small_talk_reply(message: str, language: str) -> str:
    replies = THANKS if _THANKS.search(message) else GREETINGS
    return replies.get(language, replies["en"])


def decline_text(language: str, *, one_order: bool = False) -> str:
    replies = ONE_ORDER_DECLINES if one_order else DECLINES
    return replies.get(language, replies["en"])


def system_prompt_text(*, assistant_prompt: str, excerpts_found: bool) -> str:
    """The system message of a model answering from the help center: the variant's own prompt,
    then how to use the excerpts (or, with none found, what to do without them)."""
    rules = HELP_CENTER_PROMPT if excerpts_found else NO_HELP_CENTER_MATCH_PROMPT
    return f"{assistant_prompt}\n\n{rules}"


def question_text(*, question: str, excerpts: tuple[Excerpt, ...]) -> str:
    """The customer's new message as the model reads it: the excerpts found for it, then the
    message itself (earlier messages are read as the customer wrote them)."""
    quoted = "\n\n".join(
        f"## {excerpt.source.title}{f' / {excerpt.heading}' if excerpt.heading else ''}\n{excerpt.text}"
        for excerpt in excerpts
    )
    return QUESTION_WITH_EXCERPTS.format(excerpts=quoted, question=question)
