"""Items routed before variants were data wrote to streams keyed on the variant's name."""

from django.db import migrations
from django.db.models import F


def models_backfill(apps, schema_editor):
    apps.get_model("api", "BatchJobItem").objects.filter(model="").exclude(variant="").update(model=F("variant"))


class Migration(migrations.Migration):
    dependencies = [("api", "0002_variants")]

    operations = [migrations.RunPython(models_backfill, migrations.RunPython.noop)]
