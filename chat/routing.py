"""The chat's routes that Channels serves rather than Django's URLconf, mounted by config/routing.py."""

from django.urls import path

from chat.consumers import EVENTS_ROUTE, STREAM_ROUTE, answer_stream, conversation_events

http_urlpatterns = [
    path(STREAM_ROUTE, answer_stream),
    path(EVENTS_ROUTE, conversation_events),
]
