"""The account model moved to the accounts app (accounts 0001): only Django's record of it moves,
its table stays."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0008_api_models_moved_to_api'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
            migrations.AlterField(
                model_name='conversation',
                name='owner',
                field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, to=settings.AUTH_USER_MODEL),
            ),
            migrations.DeleteModel(
                name='User',
            ),
            ],
        ),
    ]
