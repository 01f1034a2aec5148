"""Sign-in and sign-out, mounted under /accounts/; the names stay global (LOGIN_URL = "login")."""

from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import views

urlpatterns = [
    # A signed-in visitor sent here with a `next` (staff following a link to the console) goes
    # straight on; Django checks that `next` stays on this site either way.
    path("login/", views.login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
