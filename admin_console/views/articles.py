"""The help articles page, staff only: parse, check access, call one service or selector, render."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from admin_console.access import console_power, staff_required
from admin_console.forms import ArticleForm
from admin_console.services import articles as articles_services
from admin_console.views.page import _render
from knowledge import selectors as knowledge_selectors
from knowledge.embedding import EmbedderUnavailable
from knowledge.models import Article


@require_GET
@staff_required
def articles(request: HttpRequest) -> HttpResponse:
    context = {
        "articles": knowledge_selectors.articles_all(),
        "version": knowledge_selectors.knowledge_base_version(),
    }
    return _render(request, "admin_console/articles.html", "articles", context)


def _article_form_page(
    request: HttpRequest, form: ArticleForm, article: Article | None, status: int = 200
) -> HttpResponse:
    context = {"form": form, "article": article}
    return _render(request, "admin_console/article_form.html", "articles", context, status=status)


def _article_saved(request: HttpRequest, form: ArticleForm, article: Article | None) -> bool:
    """Create or update from a valid form; False (with the reason on the form) when refused."""
    try:
        if article is None:
            articles_services.article_create(actor=request.user, **form.cleaned_data)
        elif not articles_services.article_update(actor=request.user, article=article, **form.cleaned_data):
            messages.success(request, "Nothing changed.")
            return True
    except ValidationError as exc:
        form.add_error(None, exc)
        return False
    except EmbedderUnavailable as exc:
        form.add_error(None, f"Articles cannot be saved until the embedding model is prepared: {exc}")
        return False
    messages.success(request, f"Saved “{form.cleaned_data['title']}”: answers use it within a second or two.")
    return True


@require_http_methods(["GET", "POST"])
@console_power("manage_help_center")
def article_create(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _article_form_page(request, ArticleForm(), None)
    form = ArticleForm(request.POST)
    if form.is_valid() and _article_saved(request, form, None):
        return redirect("console:articles")
    return _article_form_page(request, form, None, status=400)


@require_http_methods(["GET", "POST"])
@console_power("manage_help_center")
def article_edit(request: HttpRequest, article_id: int) -> HttpResponse:
    article = get_object_or_404(Article, pk=article_id)
    if request.method == "GET":
        return _article_form_page(request, ArticleForm(instance=article), article)
    # A copy: the form writes cleaned values onto its instance, and the service compares them.
    form = ArticleForm(request.POST, instance=Article.objects.get(pk=article.pk))
    if form.is_valid() and _article_saved(request, form, article):
        return redirect("console:articles")
    return _article_form_page(request, form, article, status=400)


@require_POST
@console_power("manage_help_center")
def article_retire(request: HttpRequest, article_id: int) -> HttpResponse:
    article = get_object_or_404(Article, pk=article_id)
    articles_services.article_status_set(actor=request.user, article=article, status=Article.Status.RETIRED)
    messages.success(request, f"Retired “{article.title}”: answers stop quoting it within a second or two.")
    return redirect("console:articles")


@require_POST
@console_power("manage_help_center")
def article_restore(request: HttpRequest, article_id: int) -> HttpResponse:
    article = get_object_or_404(Article, pk=article_id)
    articles_services.article_status_set(actor=request.user, article=article, status=Article.Status.ACTIVE)
    messages.success(request, f"Restored “{article.title}”.")
    return redirect("console:articles")
