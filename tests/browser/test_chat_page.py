"""The chat page in a real browser: an answer streams in, Stop stops it, thumbs are kept."""

import time

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import js_errors, new_page
from tests.e2e.conftest import running_stack

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack():
    # Slow enough to watch an answer grow and press Stop: 60 tokens, about 0.1 s each.
    yield from running_stack(SIMULATED_OUTPUT_TOKENS="60", SIMULATED_DECODE_BASE_S="0.1")


@pytest.fixture
def page(browser, stack) -> Page:
    page = new_page(browser, stack.base_url)
    yield page
    page.context.close()


def _ask(page: Page, text: str):
    page.goto("/")
    page.get_by_label("Your message").fill(text)
    page.keyboard.press("Enter")
    answer = page.locator(".bubble--assistant").last
    expect(answer.locator(".bubble__content")).to_contain_text("[simulated] You asked:")
    return answer


def test_an_answer_streams_in_and_stop_stops_it(page, stack):
    errors = js_errors(page)
    answer = _ask(page, "Where is my parcel?")
    content = answer.locator(".bubble__content")
    shown = len(content.inner_text())
    expect(answer).to_have_attribute("data-phase", "streaming")
    page.wait_for_function(
        "([el, n]) => el.textContent.length > n", arg=[content.element_handle(), shown], polling=100
    )

    answer.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "cancelled")
    expect(answer.locator(".bubble__status")).to_have_text("Stopped")
    stopped_at = content.inner_text()
    time.sleep(1.0)  # tokens arrive every 0.1 s: a second of silence means none follow
    assert content.inner_text() == stopped_at
    assert len(stopped_at.split()) < 60
    assert stack.db_rows(
        "SELECT status FROM chat_message WHERE role = 'assistant' ORDER BY id DESC LIMIT 1"
    ) == [{"status": "cancelled"}]
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    assert errors == []


def test_a_finished_answer_takes_a_thumbs_down(page, stack):
    answer = _ask(page, "Can I change my delivery address?")
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    down = answer.get_by_role("button", name="Not helpful")
    down.click()
    expect(down).to_have_attribute("aria-pressed", "true")
    expect(answer.get_by_role("status")).to_have_text("Thanks for your feedback.")
    assert stack.db_rows(
        "SELECT feedback FROM chat_message WHERE role = 'assistant' ORDER BY id DESC LIMIT 1"
    ) == [{"feedback": -1}]
