"""API keys and batch jobs, moved here from the chat app (chat 0004 made their tables, which
keep their names). Only Django's record of the models is made here; the database keeps its
tables and rows, and the models' content types are relabelled so their permissions and admin
history follow them."""

import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models

MODELS = ["apikey", "batchjob", "batchjobitem"]


def _relabel(from_label: str, to_label: str):
    def relabel(apps, schema_editor):
        content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
        taken = content_types.filter(app_label=to_label, model__in=MODELS).values_list("model", flat=True)
        content_types.filter(app_label=from_label, model__in=MODELS).exclude(model__in=list(taken)).update(
            app_label=to_label
        )

    return relabel


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('chat', '0007_message_sources'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('scheduler', '0004_generation'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
            migrations.CreateModel(
                name='ApiKey',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('name', models.CharField(blank=True, max_length=100)),
                    ('prefix', models.CharField(max_length=16, unique=True)),
                    ('key_hash', models.CharField(max_length=64, unique=True)),
                    ('tier', models.CharField(blank=True, choices=[('normal', 'Normal'), ('vip', 'VIP')], max_length=16)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('last_used_at', models.DateTimeField(blank=True, null=True)),
                    ('revoked_at', models.DateTimeField(blank=True, null=True)),
                    ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_keys', to=settings.AUTH_USER_MODEL)),
                ],
                options={
                    'verbose_name': 'API key',
                    'db_table': 'chat_apikey',
                    'ordering': ['-created_at', '-id'],
                },
            ),
            migrations.CreateModel(
                name='BatchJob',
                fields=[
                    ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                    ('status', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('completed', 'Completed'), ('cancelled', 'Cancelled'), ('key_revoked', 'Key revoked')], default='queued', max_length=16)),
                    ('runner', models.CharField(blank=True, max_length=32)),
                    ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('started_at', models.DateTimeField(blank=True, null=True)),
                    ('finished_at', models.DateTimeField(blank=True, null=True)),
                    ('api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='api.apikey')),
                    ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='batch_jobs', to=settings.AUTH_USER_MODEL)),
                ],
                options={
                    'db_table': 'chat_batchjob',
                    'ordering': ['-created_at'],
                },
            ),
            migrations.CreateModel(
                name='BatchJobItem',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('index', models.PositiveIntegerField()),
                    ('request', models.JSONField()),
                    ('variant', models.CharField(blank=True, max_length=64)),
                    ('status', models.CharField(choices=[('pending', 'Pending'), ('submitted', 'Submitted'), ('completed', 'Completed'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='pending', max_length=16)),
                    ('submitted_at', models.DateTimeField(blank=True, null=True)),
                    ('completed_at', models.DateTimeField(blank=True, null=True)),
                    ('generation', models.OneToOneField(blank=True, db_column='request_id', db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='batch_item', to='scheduler.generation', to_field='request_id')),
                    ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='items', to='api.batchjob')),
                ],
                options={
                    'db_table': 'chat_batchjobitem',
                    'ordering': ['job', 'index'],
                },
            ),
            migrations.AddIndex(
                model_name='batchjob',
                index=models.Index(fields=['status', 'lease_expires_at'], name='chat_batchj_status_4c3cc5_idx'),
            ),
            migrations.AddIndex(
                model_name='batchjobitem',
                index=models.Index(fields=['job', 'status'], name='chat_batchj_job_id_a52dd4_idx'),
            ),
            migrations.AddConstraint(
                model_name='batchjobitem',
                constraint=models.UniqueConstraint(fields=('job', 'index'), name='batch_job_item_index_unique'),
            ),
            ],
            database_operations=[
                migrations.RunPython(_relabel("chat", "api"), _relabel("api", "chat")),
            ],
        ),
    ]
