from uuid import UUID

from django import template

from chat.consumers import events_url as _events_url
from chat.consumers import stream_url as _stream_url

register = template.Library()


@register.simple_tag
def stream_url(request_id: UUID | str) -> str:
    """The URL of a request's answer stream, which no view of the URLconf serves."""
    return _stream_url(request_id)


@register.simple_tag
def events_url(conversation_id: UUID | str) -> str:
    """The URL of a conversation's hand-off events, which no view of the URLconf serves either."""
    return _events_url(conversation_id)
