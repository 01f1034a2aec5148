from django.urls import path

from bench import views

urlpatterns = [
    path("bench/bare-sse", views.bare_tokens, name="bench-bare-sse"),
    path("bench/bare-sse/start", views.bare_start, name="bench-bare-start"),
    path("bench/collect", views.collect, name="bench-collect"),
]
