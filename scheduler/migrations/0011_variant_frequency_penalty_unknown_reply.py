"""Two more of a variant's settings: the frequency penalty, and the fixed reply for a first
question the help center has nothing on. The shipped variants take the penalty the settings
give (chosen by the quality score); other variants keep answering as they did (0: none)."""

import django.core.validators
from django.conf import settings
from django.db import migrations, models


def shipped_variants_penalise(apps, schema_editor):
    Variant = apps.get_model("scheduler", "Variant")
    Variant.objects.filter(name__in=["stable", "candidate"]).update(
        frequency_penalty=settings.GENERATION_FREQUENCY_PENALTY
    )


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0010_merge_key_limits_and_variants")]

    operations = [
        migrations.AddField(
            model_name="variant",
            name="frequency_penalty",
            field=models.FloatField(
                default=0.0,
                validators=[
                    django.core.validators.MinValueValidator(-2.0),
                    django.core.validators.MaxValueValidator(2.0),
                ],
            ),
        ),
        migrations.AddField(
            model_name="variant",
            name="unknown_reply",
            field=models.BooleanField(
                default=True,
                help_text="When the help center has nothing on a conversation's first question, reply "
                "that we do not know (in the customer's language) instead of asking the model.",
            ),
        ),
        migrations.RunPython(shipped_variants_penalise, migrations.RunPython.noop),
    ]
