"""Which language a customer writes in, from a few words, typos and all."""

import pytest

from knowledge.language import text_language


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("How long do I have to return an item?", "en"),
        ("jai recu une lampe avec le pied cassé, je fais quoi ??", "fr"),
        ("Et pour un canapé ?", "fr"),
        ("hola! compre un sofa, cuanto tarda en lelgar?", "es"),
        ("¿Y si soy miembro de Larkspur Plus?", "es"),
        ("kann ich einen tepich in einer anderen farbe umtauschen?", "de"),
        ("Wie schnell beantwortet ihr E-Mails?", "de"),
    ],
)
def test_the_language_of_a_customers_message(text, language):
    assert text_language(text) == language


def test_a_message_with_no_telling_word_has_no_language():
    assert text_language("Klarna?") is None
    assert text_language("👍") is None
