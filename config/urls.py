from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from accounts.views import login_throttled
from admin_console import health, metrics_view

urlpatterns = [
    path("", include("chat.urls")),
    path("v1/", include("api.urls")),
    path("accounts/", include("accounts.urls")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_view.metrics, name="metrics"),
    # The admin's own sign-in, throttled as the customers' is (ahead of admin.site.urls, whose
    # "admin:login" names the same path).
    path("admin/login/", login_throttled(admin.site.login)),
    path("admin/", admin.site.urls),
    path("console/", include("admin_console.urls")),
    path("help/", include("knowledge.urls")),
]

if settings.BENCH_ENDPOINTS:
    urlpatterns.append(path("", include("bench.urls")))
