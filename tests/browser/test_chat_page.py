"""The chat page in a real browser: an answer streams in, Stop stops it, thumbs are kept."""

import time

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import js_errors, new_page, sign_in
from tests.e2e.conftest import running_stack

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack():
    # Slow enough to watch an answer grow and press Stop: 60 tokens, about 0.1 s each.
    yield from running_stack(SIMULATED_OUTPUT_TOKENS="60", SIMULATED_DECODE_BASE_S="0.1")


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
        "SELECT g.status FROM chat_message m JOIN scheduler_generation g ON g.request_id = m.request_id"
        " WHERE m.role = 'assistant' ORDER BY m.id DESC LIMIT 1"
    ) == [{"status": "cancelled"}]
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    assert errors == []


def test_a_signed_in_customer_gives_a_finished_answer_a_thumbs_down(page, stack):
    sign_in(page, "alice", "alice-demo-pass")  # guests cannot vote
    answer = _ask(page, "Can I change my delivery address?")
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    down = answer.get_by_role("button", name="Not helpful")
    down.click()
    expect(down).to_have_attribute("aria-pressed", "true")
    expect(answer.get_by_role("status")).to_have_text("Thanks for your feedback.")
    assert stack.db_rows(
        "SELECT feedback FROM chat_message WHERE role = 'assistant' ORDER BY id DESC LIMIT 1"
    ) == [{"feedback": -1}]


# Eight words, all echoed by the simulated engine: Markdown, a link the renderer must refuse,
# and HTML that must stay text.
MARKDOWN_QUESTION = (
    "**Parcel** `ABC-123` [track](https://example.org/t) [x](javascript:alert(1)) "
    "<b>bold</b> <img src=x onerror=window.pwned=1>"
)


def _assert_rendered_safely(answer) -> None:
    content = answer.locator(".bubble__content")
    expect(content.locator("strong")).to_have_text("Parcel")
    expect(content.locator("code")).to_have_text("ABC-123")
    link = content.get_by_role("link", name="track")
    expect(link).to_have_attribute("href", "https://example.org/t")
    expect(link).to_have_attribute("rel", "noopener noreferrer")
    expect(content).to_contain_text("[x](javascript:alert(1))")
    expect(content).to_contain_text("<b>bold</b> <img src=x onerror=window.pwned=1>")
    assert content.locator("a[href^='javascript'], b, img").count() == 0


def test_a_markdown_answer_renders_as_html_and_html_in_it_shows_as_text(page, stack):
    errors = js_errors(page)
    answer = _ask(page, MARKDOWN_QUESTION)
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    _assert_rendered_safely(answer)

    page.reload()  # a stored answer is rendered by the same renderer
    _assert_rendered_safely(page.locator(".bubble--assistant").last)
    assert page.evaluate("window.pwned") is None
    assert errors == []


@pytest.mark.parametrize(
    ("source", "present", "absent"),
    [
        ("# Returns\n\n- one\n- two", ["<h3>Returns</h3>", "<li>one</li>"], []),
        ("```html\n<script>alert(1)</script>\n```", ["&lt;script&gt;alert(1)&lt;/script&gt;"], ["<script"]),
        ("Write to support@example.com", ['href="mailto:support@example.com"'], []),
        ("See https://example.org/a).", ['<a href="https://example.org/a"'], []),
        ("[home](/accounts/) [data](data:text/html,x) example.org", [], ["<a"]),
        ("![logo](https://example.org/logo.png)", [], ["<img"]),
    ],
)
def test_the_markdown_renderer_keeps_only_safe_tags_and_links(page, stack, source, present, absent):
    page.goto("/")
    html = page.evaluate("(source) => window.SupportChat.renderMarkdown(source)", source)
    for fragment in present:
        assert fragment in html
    for fragment in absent:
        assert fragment not in html


def test_the_sidebar_titles_each_conversation_by_its_first_question(page, stack):
    answer = _ask(page, "Can I change the delivery address of an order that has already shipped?")
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    page.get_by_role("button", name="New chat").click()
    sidebar = page.locator(".sidebar")
    expect(sidebar.locator("[aria-current=page]")).to_contain_text("New conversation")
    expect(sidebar.get_by_role("link", name="Can I change the delivery address of an…")).to_be_visible()


def test_customers_see_no_variant_name_and_staff_do(page, browser, stack):
    answer = _ask(page, "Which model wrote this?")
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    expect(answer.locator(".bubble__simulated")).to_be_visible()
    expect(answer.locator(".bubble__variant")).to_have_count(0)
    page.reload()
    expect(page.locator(".bubble__variant")).to_have_count(0)

    staff = new_page(browser, stack.base_url)
    sign_in(staff, "sam", stack.staff_password)
    answer = _ask(staff, "Which model wrote this?")
    expect(answer.locator(".bubble__variant")).to_have_text("stable")
    staff.context.close()


def test_signing_in_goes_on_to_a_safe_next_page_only(browser, stack):
    page = new_page(browser, stack.base_url)
    page.goto("/console/")
    # The sign-in page offers one way in, and that one keeps `next`.
    expect(page.get_by_role("link", name="Sign in")).to_have_count(0)
    sign_in(page, "sam", stack.staff_password, next_url="/console/")
    expect(page.get_by_role("heading", name="Live dashboard")).to_be_visible()
    # Already signed in, a link to sign in for the console goes straight there.
    page.goto("/accounts/login/?next=/console/")
    expect(page.get_by_role("heading", name="Live dashboard")).to_be_visible()
    page.context.close()

    page = new_page(browser, stack.base_url)
    page.goto("/accounts/login/?next=https://example.org/console/")
    page.get_by_label("Username").fill("sam")
    page.get_by_label("Password").fill(stack.staff_password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{stack.base_url}/")
    page.context.close()
