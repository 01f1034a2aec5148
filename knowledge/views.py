"""Public help center pages: the list of articles and each article, rendered from Markdown."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from knowledge import selectors
from knowledge.rendering import article_html


@require_GET
def help_index(request: HttpRequest) -> HttpResponse:
    return render(request, "knowledge/index.html", {"articles": selectors.articles_public()})


@require_GET
def article(request: HttpRequest, slug: str) -> HttpResponse:
    found = selectors.article_public(slug=slug)
    if found is None:
        moved = selectors.article_public_moved_from(slug=slug)
        if moved is None:
            raise Http404("No such help article.")
        return redirect("knowledge:article", slug=moved.slug, permanent=True)
    context = {"article": found, "body_html": article_html(found.body)}
    return render(request, "knowledge/article.html", context)
