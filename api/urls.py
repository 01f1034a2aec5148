"""URLs of the OpenAI-compatible API, mounted under /v1/ (OpenAI clients append these paths)."""

from django.urls import path, re_path

from api import views as api

app_name = "api"

urlpatterns = [
    path("openapi.json", api.openapi, name="openapi"),
    path("models", api.models, name="models"),
    path("models/<path:model_id>", api.model_detail, name="model"),
    path("chat/completions", api.chat_completions, name="chat_completions"),
    path("completions", api.text_completions, name="completions"),
    path("jobs", api.job_create, name="jobs"),
    path("jobs/<uuid:job_id>", api.job_detail, name="job"),
    path("jobs/<uuid:job_id>/cancel", api.job_cancel, name="job_cancel"),
    re_path(r"^(?P<path>[\s\S]*)$", api.not_found),
]
