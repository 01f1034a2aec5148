"""The variants `make run` starts with: `stable`, as the settings answered before variants were
data, and `candidate`, the same model with a terser prompt and cooler sampling, so the console
has a canary to try on the one worker. Records from before keep their streams: those were
keyed on the variant's name."""

from django.conf import settings
from django.db import migrations
from django.db.models import F

CANDIDATE_PROMPT = (
    "You are the customer-service assistant of an online shop. Answer in at most three short "
    "sentences, and end by asking whether that solved the customer's problem."
)


def variants_create(apps, schema_editor):
    Variant = apps.get_model("scheduler", "Variant")
    common = {"model": settings.INFERENCE_MODEL_NAME, "max_tokens": settings.GENERATION_MAX_TOKENS}
    Variant.objects.get_or_create(
        name="stable",
        defaults={
            **common,
            "system_prompt": settings.CHAT_SYSTEM_PROMPT,
            "temperature": settings.GENERATION_TEMPERATURE,
            "top_p": settings.GENERATION_TOP_P,
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
            "description": "Shorter answers, cooler sampling: a canary to try on the same model.",
        },
    )
    apps.get_model("scheduler", "Generation").objects.filter(model="").update(model=F("variant"))


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0006_variants")]

    operations = [migrations.RunPython(variants_create, migrations.RunPython.noop)]
