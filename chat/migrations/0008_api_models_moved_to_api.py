"""API keys and batch jobs moved to the api app: only Django's record of the models moves, their
tables stay (the api app's models name them with `db_table`)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0007_message_sources'),
        ('api', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
            migrations.RemoveField(
                model_name='batchjob',
                name='api_key',
            ),
            migrations.RemoveField(
                model_name='batchjob',
                name='owner',
            ),
            migrations.RemoveField(
                model_name='batchjobitem',
                name='job',
            ),
            migrations.RemoveField(
                model_name='batchjobitem',
                name='generation',
            ),
            migrations.DeleteModel(
                name='ApiKey',
            ),
            migrations.DeleteModel(
                name='BatchJob',
            ),
            migrations.DeleteModel(
                name='BatchJobItem',
            ),
            ],
        ),
    ]
