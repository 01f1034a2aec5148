"""Article Markdown -> HTML for the public help pages.

Raw HTML in an article is escaped, not passed through (html off), and markdown-it's link
check refuses javascript:, vbscript:, file: and data: links: an article edited in the console
cannot run script on a customer's page.
"""

from __future__ import annotations

from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")


def article_html(body: str) -> SafeString:
    return mark_safe(_markdown.render(body))
