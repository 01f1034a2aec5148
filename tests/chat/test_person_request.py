"""Asking for a person in words, in the four languages the chat answers in."""

import pytest

from chat.person_request import asks_for_person

ASKS = {
    "en": [
        "agent",
        "Human please",
        "I want to talk to a human",
        "Can I speak to a real person?",
        "let me talk to an agent please",
        "I need a human",
        "connect me to customer service",
        "talk to someone",
    ],
    "fr": [
        "Je voudrais parler à un conseiller",
        "un humain svp",
        "Passez-moi un conseiller s'il vous plaît",
        "je veux une vraie personne",
        "puis-je parler avec quelqu'un ?",
    ],
    "es": [
        "Quiero hablar con una persona",
        "¡Un agente, por favor!",
        "necesito un asesor",
        "¿Puedo hablar con alguien real?",
        "atención al cliente",
    ],
    "de": [
        "Ich möchte mit einem Menschen sprechen",
        "Mensch bitte",
        "Kundenservice bitte",
        "kann ich mit jemandem reden?",
        "Ich brauche einen Mitarbeiter",
    ],
}

QUESTIONS = {
    "en": [
        "How long do I have to return an item?",
        "Is a human checking my return?",
        "Do your agents ship to Canada?",
        "I need someone to sign for my parcel",
        "Can someone deliver on Saturday?",
    ],
    "fr": ["Combien de temps pour un remboursement ?", "Un livreur peut-il passer samedi ?"],
    "es": ["¿Cuánto cuesta el envío?", "¿Una persona puede recoger mi pedido?"],
    "de": ["Wie lange dauert der Versand?", "Kann eine andere Person mein Paket abholen?"],
}


@pytest.mark.parametrize(
    ("language", "text"), [(lang, text) for lang, texts in ASKS.items() for text in texts]
)
def test_asking_for_a_person_is_recognised(language, text):
    assert asks_for_person(text)


@pytest.mark.parametrize(
    ("language", "text"), [(lang, text) for lang, texts in QUESTIONS.items() for text in texts]
)
def test_a_question_that_mentions_people_is_left_to_the_assistant(language, text):
    assert not asks_for_person(text)


def test_a_long_message_is_a_question_whatever_it_says():
    assert not asks_for_person("I want to talk to a human about " + "my order and its delivery " * 10)
