"""The help center in a real browser, with the answer style `make run` ships (extractive): an
answer quotes the help center in the customer's language and lists the articles it quotes, whose
links open them; a question it does not answer gets the decline."""

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import js_errors
from tests.e2e.conftest import running_stack
from tests.knowledge.conftest import DEMO_HELP_CENTER

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack():
    for stack in running_stack(CHAT_ANSWER_STYLE="extractive"):
        done = stack.manage("import_articles", str(DEMO_HELP_CENTER))
        assert done.returncode == 0, done.stderr
        yield stack


def _ask(page: Page, text: str):
    page.goto("/")
    page.get_by_label("Your message").fill(text)
    page.keyboard.press("Enter")
    answer = page.locator(".bubble--assistant").last
    expect(answer).to_have_attribute("data-status", "done")
    return answer


def test_an_answer_shows_its_sources_as_links_to_the_articles(page, stack):
    errors = js_errors(page)
    answer = _ask(page, "How long do I have to return an item?")
    sources = answer.get_by_role("navigation", name="Sources")
    expect(sources).to_be_visible()
    link = sources.get_by_role("link", name="Returns policy")
    expect(link).to_have_attribute("href", "/help/returns-policy")
    # An answer that helped offers no person under it.
    expect(answer.get_by_role("button", name="Talk to a person")).to_be_hidden()

    # Reloaded, the stored answer keeps its sources, and still offers no person.
    page.reload()
    stored = page.locator(".bubble--assistant").last
    expect(stored.get_by_role("link", name="Returns policy")).to_be_visible()
    expect(stored.get_by_role("button", name="Talk to a person")).to_be_hidden()

    article = page.context.new_page()
    article.goto("/help/returns-policy")
    expect(article.get_by_role("heading", level=1)).to_have_text("Returns policy")
    expect(article.get_by_role("heading", name="What a return costs")).to_be_visible()
    assert errors == []


def test_a_question_in_french_is_answered_from_the_french_articles(page, stack):
    answer = _ask(page, "Combien coûte une étiquette de retour ?")
    expect(answer.locator(".bubble__content")).to_contain_text("$6.50")
    expect(answer.locator(".bubble__content")).to_contain_text("étiquette de retour")
    expect(answer.get_by_role("navigation", name="Sources").get_by_role("link")).to_have_attribute(
        "href", "/help/returns-policy-fr"
    )


def test_a_table_row_is_shown_as_a_table_under_its_header(page, stack):
    answer = _ask(page, "What does next-day delivery cost?")
    table = answer.locator(".bubble__content table")
    expect(table.locator("th").first).to_have_text("Method")
    expect(table).to_contain_text("$24.95")


def test_an_answer_the_help_center_does_not_cover_is_the_decline_with_no_sources(page, stack):
    answer = _ask(page, "What is the capital of France?")
    expect(answer.locator(".bubble__content")).to_contain_text("I couldn't find this in our help center")
    expect(answer.locator(".bubble__sources")).to_have_count(0)
    # A decline offers a person, live and after a reload.
    expect(answer.get_by_role("button", name="Talk to a person")).to_be_visible()
    page.reload()
    stored = page.locator(".bubble--assistant").last
    expect(stored.get_by_role("button", name="Talk to a person")).to_be_visible()
