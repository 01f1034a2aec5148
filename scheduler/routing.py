"""Which model variant answers a conversation."""

from django.conf import settings


def variant_for(*, conversation_id: str) -> str:
    return settings.INFERENCE_VARIANT
