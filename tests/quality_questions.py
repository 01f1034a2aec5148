"""Customer questions the quality score's tests grade and the result cache's tests ask again."""

from knowledge.quality import QualityQuestion

RETURNS = QualityQuestion(
    id="returns",
    question="How long do I have to return an item?",
    source="returns-policy",
    facts=("30 days",),
)
# A rewording the result cache matches: the same normalised text.
RETURNS_AGAIN = QualityQuestion(
    id="returns-again",
    question="how long do I have to return an item",
    source="returns-policy",
    facts=("30 days",),
)
RETURNS_FR = QualityQuestion(
    id="returns-fr",
    question="Combien de temps ai-je pour retourner un article ?",
    language="fr",
    source="returns-policy",
    facts=("30 jours",),
)
CAPITAL = QualityQuestion(id="capital", question="What is the capital of France?", unanswerable=True)
