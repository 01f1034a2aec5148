"""The one knowledge base, empty, noting the model its embeddings are made with."""

from django.db import migrations

from knowledge.embedding import EMBEDDING_MODEL


def knowledge_base_create(apps, schema_editor):
    apps.get_model("knowledge", "KnowledgeBase").objects.get_or_create(
        pk=1, defaults={"embedding_model": EMBEDDING_MODEL}
    )


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0001_initial")]

    operations = [migrations.RunPython(knowledge_base_create, migrations.RunPython.noop)]
