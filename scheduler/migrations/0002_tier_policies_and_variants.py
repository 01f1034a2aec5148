"""What a new database starts with: a policy for each tier, as the settings give them (edited in
the console after that), and two variants on the configured model: `stable`, answering as the
settings say, and `candidate`, a terser prompt with cooler sampling and verified answers, so the
console has a canary to try on the one worker."""

from django.conf import settings
from django.db import migrations

CANDIDATE_PROMPT = (
    "You are the customer-service assistant of an online shop. Answer in at most three short "
    "sentences, and end by asking whether that solved the customer's problem."
)


def tier_policies_create(apps, schema_editor):
    TierPolicy = apps.get_model("scheduler", "TierPolicy")
    for tier, fields in settings.RATE_LIMIT_POLICIES.items():
        TierPolicy.objects.get_or_create(tier=tier, defaults=fields)


def variants_create(apps, schema_editor):
    Variant = apps.get_model("scheduler", "Variant")
    common = {
        "model": settings.INFERENCE_MODEL_NAME,
        "max_tokens": settings.GENERATION_MAX_TOKENS,
        "frequency_penalty": settings.GENERATION_FREQUENCY_PENALTY,
    }
    Variant.objects.get_or_create(
        name="stable",
        defaults={
            **common,
            "system_prompt": settings.CHAT_SYSTEM_PROMPT,
            "temperature": settings.GENERATION_TEMPERATURE,
            "top_p": settings.GENERATION_TOP_P,
            "answer_style": settings.CHAT_ANSWER_STYLE,
            "description": "The prompt and sampling answers had before variants were data.",
        },
    )
    Variant.objects.get_or_create(
        name="candidate",
        defaults={
            **common,
            "system_prompt": CANDIDATE_PROMPT,
            "temperature": 0.3,
            "top_p": 0.9,
            "answer_style": "verified",
            "description": "Shorter answers, cooler sampling: a canary to try on the same model.",
        },
    )


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0001_initial")]

    operations = [
        migrations.RunPython(tier_policies_create, migrations.RunPython.noop),
        migrations.RunPython(variants_create, migrations.RunPython.noop),
    ]
