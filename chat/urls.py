from django.urls import path

from chat import views

app_name = "chat"

urlpatterns = [
    path("", views.home, name="home"),
    path("chat/conversations", views.conversation_new, name="conversation_new"),
    path("chat/<uuid:conversation_id>", views.conversation_page, name="conversation"),
    path("chat/<uuid:conversation_id>/messages", views.message_post, name="message_post"),
    path("chat/<uuid:conversation_id>/handoff", views.handoff_state, name="handoff_state"),
    path("chat/<uuid:conversation_id>/handoff/request", views.handoff_request, name="handoff_request"),
    path("chat/<uuid:conversation_id>/handoff/withdraw", views.handoff_withdraw, name="handoff_withdraw"),
    path("chat/<uuid:conversation_id>/handoff/typing", views.handoff_typing, name="handoff_typing"),
    path("chat/<uuid:conversation_id>/handoff/rating", views.handoff_rating, name="handoff_rating"),
    path("chat/requests/<uuid:request_id>/cancel", views.request_cancel, name="request_cancel"),
    path("chat/messages/<int:message_id>/feedback", views.message_feedback, name="message_feedback"),
]
