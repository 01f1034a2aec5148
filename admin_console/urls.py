from django.urls import path

from admin_console import handoff_views, views

app_name = "console"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("live", views.dashboard_live, name="dashboard_live"),
    path("workers/<str:worker_id>/drain", views.worker_drain, name="worker_drain"),
    path("workers/spares", views.warm_spares, name="warm_spares"),
    path("limits", views.limits, name="limits"),
    path("limits/fair-share", views.source_weights_update, name="source_weights_update"),
    path("limits/<str:tier>", views.limit_update, name="limit_update"),
    path("variants", views.variants, name="variants"),
    path("variants/new", views.variant_create, name="variant_create"),
    path("variants/<slug:name>", views.variant_update, name="variant_update"),
    path("cache", views.cache, name="cache"),
    path("cache/pin", views.answer_pin, name="answer_pin"),
    path("cache/<int:entry_id>/unpin", views.answer_unpin, name="answer_unpin"),
    path("canary", views.canary, name="canary"),
    path("canary/start", views.canary_start, name="canary_start"),
    path("canary/split", views.canary_split, name="canary_split"),
    path("canary/promote", views.canary_promote, name="canary_promote"),
    path("canary/rollback", views.canary_rollback, name="canary_rollback"),
    path("canary/quality", views.canary_quality, name="canary_quality"),
    path("canary/quality/start", views.canary_quality_start, name="canary_quality_start"),
    path("knowledge", views.articles, name="articles"),
    path("knowledge/new", views.article_create, name="article_create"),
    path("knowledge/<int:article_id>", views.article_edit, name="article_edit"),
    path("knowledge/<int:article_id>/retire", views.article_retire, name="article_retire"),
    path("knowledge/<int:article_id>/restore", views.article_restore, name="article_restore"),
    path("audit", views.audit_log, name="audit"),
    path("inbox", handoff_views.inbox, name="inbox"),
    path("inbox/snapshot", handoff_views.inbox_snapshot_view, name="inbox_snapshot"),
    path("inbox/profile", handoff_views.agent_profile, name="agent_profile"),
    path("inbox/target", handoff_views.handoff_target, name="handoff_target"),
    path("inbox/<uuid:conversation_id>", handoff_views.conversation_view, name="inbox_conversation"),
    path("inbox/<uuid:conversation_id>/claim", handoff_views.conversation_claim, name="inbox_claim"),
    path("inbox/<uuid:conversation_id>/reply", handoff_views.conversation_reply, name="inbox_reply"),
    path("inbox/<uuid:conversation_id>/note", handoff_views.conversation_note, name="inbox_note"),
    path(
        "inbox/<uuid:conversation_id>/hand-back", handoff_views.conversation_hand_back, name="inbox_hand_back"
    ),
    path("inbox/<uuid:conversation_id>/resolve", handoff_views.conversation_resolve, name="inbox_resolve"),
    path("experiments", handoff_views.experiments, name="experiments"),
    path("experiments/start", handoff_views.experiment_start, name="experiment_start"),
    path("experiments/end", handoff_views.experiment_end, name="experiment_end"),
    path("api-keys", views.api_keys, name="api_keys"),
    path("api-keys/create", views.api_key_create, name="api_key_create"),
    path("api-keys/<int:key_id>/revoke", views.api_key_revoke, name="api_key_revoke"),
    path("api-keys/<int:key_id>/limits", views.api_key_limits, name="api_key_limits"),
]
