"""Answers move to the scheduler's generation records: each assistant message and each
submitted batch item gets a Generation with its answer, then links to it by request id (the
same column) and drops its own copy."""

import django.db.models.deletion
from django.db import migrations, models

# A batch item's state -> its generation's; items not yet submitted get theirs at submission.
ITEM_STATUS = {"submitted": "pending", "completed": "done", "failed": "error", "cancelled": "cancelled"}


def _link(related_name: str) -> models.OneToOneField:
    return models.OneToOneField(
        blank=True,
        db_column="request_id",
        db_constraint=False,
        null=True,
        on_delete=django.db.models.deletion.DO_NOTHING,
        related_name=related_name,
        to="scheduler.generation",
        to_field="request_id",
    )


def answers_copy(apps, schema_editor):
    Generation = apps.get_model("scheduler", "Generation")
    Message = apps.get_model("chat", "Message")
    BatchJobItem = apps.get_model("chat", "BatchJobItem")
    records, created_at = [], {}
    answers = Message.objects.filter(role="assistant", request_id__isnull=False).select_related(
        "conversation__owner"
    )
    for message in answers.iterator():
        owner = message.conversation.owner
        records.append(
            Generation(
                request_id=message.request_id,
                origin="chat",
                variant=message.variant,
                tier=owner.tier if owner is not None else "normal",
                status=message.status,
                finish_reason=message.finish_reason,
                error_code=message.error_code,
                text=message.content,
                prompt_tokens=message.prompt_tokens,
                completion_tokens=message.output_tokens,
                ttft_ms=message.ttft_ms,
                duration_ms=message.duration_ms,
                engine=message.engine,
                finished_at=message.completed_at,
            )
        )
        created_at[message.request_id] = message.created_at
    items = BatchJobItem.objects.filter(request_id__isnull=False, status__in=ITEM_STATUS).select_related("job")
    for item in items.iterator():
        status = ITEM_STATUS[item.status]
        if status == "done" and item.finish_reason == "cancelled":
            status = "cancelled"
        records.append(
            Generation(
                request_id=item.request_id,
                origin="batch",
                variant=item.variant,
                tier="batch",
                client_id=f"job:{item.job_id}",
                status=status,
                finish_reason=item.finish_reason,
                error_code=item.error_code,
                error_message=item.error_message,
                text=item.content,
                prompt_tokens=item.prompt_tokens,
                completion_tokens=item.completion_tokens,
                finished_at=item.completed_at,
            )
        )
        created_at[item.request_id] = item.submitted_at or item.job.created_at
    Generation.objects.bulk_create(records, batch_size=500)
    # created_at is set on insert: put back when each request was really made.
    for request_id, moment in created_at.items():
        Generation.objects.filter(request_id=request_id).update(created_at=moment)


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0004_api_keys_and_batch_jobs"),
        ("scheduler", "0004_generation"),
    ]

    operations = [
        migrations.RunPython(answers_copy, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="message", name="chat_messag_convers_fe668e_idx"),
        migrations.RemoveIndex(model_name="message", name="chat_messag_variant_7ff484_idx"),
        # The request_id columns stay as they are; they now hold the link.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(model_name="message", name="request_id"),
                migrations.AddField(model_name="message", name="generation", field=_link("message")),
                migrations.RemoveField(model_name="batchjobitem", name="request_id"),
                migrations.AddField(model_name="batchjobitem", name="generation", field=_link("batch_item")),
            ]
        ),
        *(
            migrations.RemoveField(model_name="message", name=name)
            for name in (
                "status",
                "variant",
                "engine",
                "finish_reason",
                "error_code",
                "prompt_tokens",
                "output_tokens",
                "ttft_ms",
                "duration_ms",
                "completed_at",
            )
        ),
        *(
            migrations.RemoveField(model_name="batchjobitem", name=name)
            for name in (
                "content",
                "finish_reason",
                "error_code",
                "error_message",
                "prompt_tokens",
                "completion_tokens",
            )
        ),
    ]
