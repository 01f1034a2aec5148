from django.urls import path

from bench import views

urlpatterns = [path("bench/bare-sse", views.bare_tokens, name="bench-bare-sse")]
