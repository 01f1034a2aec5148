"""The chat and the console under the Content-Security-Policy (`script-src 'self'`): every page
works with scripts from the site's own files only, and chromium reports no violation."""

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import js_errors, new_page, sign_in
from tests.e2e.conftest import running_stack

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.security]

CONSOLE_PAGES = ["/console/limits", "/console/variants", "/console/cache", "/console/canary",
                 "/console/knowledge", "/console/audit", "/console/experiments",
                 "/console/api-keys"]  # fmt: skip


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(SIMULATED_OUTPUT_TOKENS="8", SIMULATED_DECODE_BASE_S="0.02")


def _violations(page: Page) -> list[str]:
    """What chromium reports refusing under the page's policy, from now on."""
    refused: list[str] = []
    page.on(
        "console",
        lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None,
    )
    return refused


def test_the_chat_answers_under_the_policy(page, stack):
    violations, errors = _violations(page), js_errors(page)
    response = page.goto("/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.get_by_label("Your message").fill("Where is my parcel?")
    page.keyboard.press("Enter")
    answer = page.locator(".bubble--assistant").last
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    assert violations == []
    assert errors == []


def test_the_console_runs_under_the_policy(browser, stack):
    page = new_page(browser, stack.base_url)
    violations, errors = _violations(page), js_errors(page)
    sign_in(page, "sam", stack.staff_password, next_url="/console/")
    expect(page.locator("#live-status")).to_have_attribute("data-live", "socket")
    expect(page.locator("figure[data-chart='queue_depth'] .chart__scale")).to_be_attached()
    # Open past a poll period: the fallback poll's trigger is checked every 2 s.
    page.wait_for_function("() => performance.now() > 3000")
    for path in CONSOLE_PAGES:
        assert page.goto(path).status == 200, path
    assert violations == []
    assert errors == []
    page.context.close()
