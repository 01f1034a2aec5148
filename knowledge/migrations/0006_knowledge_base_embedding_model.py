"""The knowledge base notes the model its embeddings were made with. A help center with articles
was embedded with all-MiniLM-L6-v2 before: its model stays blank, so the next import embeds it
again (knowledge.services.embeddings_make_again); an empty one starts with today's model."""

from django.db import migrations, models

from knowledge.embedding import EMBEDDING_MODEL


def model_note(apps, schema_editor):
    if not apps.get_model("knowledge", "Article").objects.exists():
        apps.get_model("knowledge", "KnowledgeBase").objects.update(embedding_model=EMBEDDING_MODEL)


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0005_article_language_article_translation_of_sentence")]

    operations = [
        migrations.AddField(
            model_name="knowledgebase",
            name="embedding_model",
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.RunPython(model_note, migrations.RunPython.noop),
    ]
