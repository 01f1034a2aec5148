from django.urls import path

from knowledge import views

app_name = "knowledge"

urlpatterns = [
    path("", views.help_index, name="index"),
    path("<slug:slug>", views.article, name="article"),
]
