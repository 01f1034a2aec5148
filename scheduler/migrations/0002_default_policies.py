from django.conf import settings
from django.db import migrations


def create_default_policies(apps, schema_editor):
    TierPolicy = apps.get_model("scheduler", "TierPolicy")
    for tier, fields in settings.RATE_LIMIT_POLICIES.items():
        TierPolicy.objects.get_or_create(tier=tier, defaults=fields)


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0001_tier_policy")]
    operations = [migrations.RunPython(create_default_policies, migrations.RunPython.noop)]
