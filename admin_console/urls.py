from django.urls import path

from admin_console.views import api_keys as api_keys_views
from admin_console.views import articles as articles_views
from admin_console.views import audit as audit_views
from admin_console.views import cache as cache_views
from admin_console.views import canary as canary_views
from admin_console.views import dashboard as dashboard_views
from admin_console.views import experiments as experiments_views
from admin_console.views import inbox as inbox_views
from admin_console.views import limits as limits_views
from admin_console.views import variants as variants_views

app_name = "console"

urlpatterns = [
    path("", dashboard_views.dashboard, name="dashboard"),
    path("live", dashboard_views.dashboard_live, name="dashboard_live"),
    path("workers/<str:worker_id>/drain", dashboard_views.worker_drain, name="worker_drain"),
    path("workers/spares", dashboard_views.warm_spares, name="warm_spares"),
    path("limits", limits_views.limits, name="limits"),
    path("limits/fair-share", limits_views.source_weights_update, name="source_weights_update"),
    path("limits/<str:tier>", limits_views.limit_update, name="limit_update"),
    path("variants", variants_views.variants, name="variants"),
    path("variants/new", variants_views.variant_create, name="variant_create"),
    path("variants/<slug:name>", variants_views.variant_update, name="variant_update"),
    path("cache", cache_views.cache, name="cache"),
    path("cache/pin", cache_views.answer_pin, name="answer_pin"),
    path("cache/<int:entry_id>/unpin", cache_views.answer_unpin, name="answer_unpin"),
    path("canary", canary_views.canary, name="canary"),
    path("canary/start", canary_views.canary_start, name="canary_start"),
    path("canary/split", canary_views.canary_split, name="canary_split"),
    path("canary/promote", canary_views.canary_promote, name="canary_promote"),
    path("canary/rollback", canary_views.canary_rollback, name="canary_rollback"),
    path("canary/quality", canary_views.canary_quality, name="canary_quality"),
    path("canary/quality/start", canary_views.canary_quality_start, name="canary_quality_start"),
    path("knowledge", articles_views.articles, name="articles"),
    path("knowledge/new", articles_views.article_create, name="article_create"),
    path("knowledge/<int:article_id>", articles_views.article_edit, name="article_edit"),
    path("knowledge/<int:article_id>/retire", articles_views.article_retire, name="article_retire"),
    path("knowledge/<int:article_id>/restore", articles_views.article_restore, name="article_restore"),
    path("audit", audit_views.audit_log, name="audit"),
    path("inbox", inbox_views.inbox, name="inbox"),
    path("inbox/snapshot", inbox_views.inbox_snapshot_view, name="inbox_snapshot"),
    path("inbox/profile", inbox_views.agent_profile, name="agent_profile"),
    path("inbox/target", inbox_views.handoff_target, name="handoff_target"),
    path("inbox/<uuid:conversation_id>", inbox_views.conversation_view, name="inbox_conversation"),
    path("inbox/<uuid:conversation_id>/claim", inbox_views.conversation_claim, name="inbox_claim"),
    path("inbox/<uuid:conversation_id>/reply", inbox_views.conversation_reply, name="inbox_reply"),
    path("inbox/<uuid:conversation_id>/note", inbox_views.conversation_note, name="inbox_note"),
    path(
        "inbox/<uuid:conversation_id>/hand-back", inbox_views.conversation_hand_back, name="inbox_hand_back"
    ),
    path("inbox/<uuid:conversation_id>/resolve", inbox_views.conversation_resolve, name="inbox_resolve"),
    path("experiments", experiments_views.experiments, name="experiments"),
    path("experiments/start", experiments_views.experiment_start, name="experiment_start"),
    path("experiments/end", experiments_views.experiment_end, name="experiment_end"),
    path("api-keys", api_keys_views.api_keys, name="api_keys"),
    path("api-keys/create", api_keys_views.api_key_create, name="api_key_create"),
    path("api-keys/<int:key_id>/revoke", api_keys_views.api_key_revoke, name="api_key_revoke"),
    path("api-keys/<int:key_id>/limits", api_keys_views.api_key_limits, name="api_key_limits"),
]
