"""Which of an API call's n choices a generation answers, so that a key's usage counts the
call's prompt and request once (existing records are first choices: 0)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0011_variant_frequency_penalty_unknown_reply")]

    operations = [
        migrations.AddField(
            model_name="generation",
            name="choice",
            field=models.PositiveSmallIntegerField(default=0),
        ),
    ]
