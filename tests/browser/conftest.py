"""Browser tests: Playwright drives Debian's chromium, headless, against the real processes.

Playwright's own browser download is never used (CI installs Debian's `chromium`, see .ci/run).
"""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.machine import CHROMIUM

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000


# Per module, not per session: while Playwright's sync API is open, its event loop counts as
# running in the main thread, and the e2e tests' asyncio.run() would refuse to start.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def new_page(browser: Browser, base_url: str) -> Page:
    """A fresh context (own cookies, so its own guest session or account)."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    # Drain, promote and roll back ask for confirmation; the tests mean what they click.
    page.on("dialog", lambda dialog: dialog.accept())
    return page


@pytest.fixture
def page(browser: Browser, stack) -> Iterator[Page]:
    """A fresh page on the module's `stack`, closed after the test."""
    page = new_page(browser, stack.base_url)
    yield page
    page.context.close()


def js_errors(page: Page) -> list[str]:
    """Uncaught errors the page's scripts raise from now on."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def sign_in(page: Page, username: str, password: str, *, next_url: str = "/") -> None:
    page.goto(f"/accounts/login/?next={next_url}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**{next_url}")
