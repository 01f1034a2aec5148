"""The account model's content type follows it from chat to accounts, and with it its
permissions, the groups holding them and the admin's history of accounts."""

from django.db import migrations


def _relabel(from_label: str, to_label: str):
    def relabel(apps, schema_editor):
        content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
        if not content_types.filter(app_label=to_label, model="user").exists():
            content_types.filter(app_label=from_label, model="user").update(app_label=to_label)

    return relabel


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.RunPython(_relabel("chat", "accounts"), _relabel("accounts", "chat")),
    ]
