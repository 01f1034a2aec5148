"""A variant may name vLLM's tool-call parser for its model, so that API calls with
tool_choice "auto" get tool calls (blank for the existing ones: their model has none)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0012_generation_choice")]

    operations = [
        migrations.AddField(
            model_name="variant",
            name="tool_call_parser",
            field=models.CharField(
                blank=True,
                help_text="The model's tool-call parser in vLLM (e.g. pythonic, hermes, llama3_json), for "
                'API calls with tool_choice "auto"; blank: such calls are refused.',
                max_length=64,
            ),
        ),
    ]
