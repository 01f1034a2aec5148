"""The chat's routes that Channels serves rather than Django's URLconf, mounted by config/routing.py."""

from django.urls import path

from chat.consumers import STREAM_ROUTE, answer_stream

http_urlpatterns = [
    path(STREAM_ROUTE, answer_stream),
]
