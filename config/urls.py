from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from admin_console import health, metrics_view
from chat import views as chat_views

urlpatterns = [
    path("", include("chat.urls")),
    path("v1/", include("api.urls")),
    # A signed-in visitor sent here with a `next` (staff following a link to the console) goes
    # straight on; Django checks that `next` stays on this site either way.
    path("accounts/login/", chat_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_view.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("console/", include("admin_console.urls")),
    path("help/", include("knowledge.urls")),
]

if settings.BENCH_ENDPOINTS:
    urlpatterns.append(path("", include("bench.urls")))
