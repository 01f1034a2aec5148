"""The console in a real browser: who gets in, the live dashboard under load, the canary split."""

import asyncio
import threading

import pytest
from channels_redis.core import RedisChannelLayer
from playwright.sync_api import Page, expect

from scheduler import keys
from tests.browser.conftest import js_errors, new_page, sign_in
from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack
from tests.generation_jobs import MODEL

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

LOAD_MESSAGES = 36


@pytest.fixture(scope="module")
def stack():
    # Answers of about 2.5 s on 6 slots for normal traffic: a burst queues for several seconds.
    # Its one worker serves both variants: they share the model.
    yield from running_stack(SIMULATED_OUTPUT_TOKENS="40", SIMULATED_DECODE_BASE_S="0.05")


@pytest.fixture
def staff_page(browser, stack) -> Page:
    page = new_page(browser, stack.base_url)
    sign_in(page, "sam", stack.staff_password, next_url="/console/")
    yield page
    page.context.close()


def _queue_depth(page: Page) -> int:
    return int(page.locator("#queue-depth-total").get_attribute("data-value"))


def _send_burst(base_url: str, count: int) -> None:
    """`count` messages from guests at once, without reading the answers (they are served anyway)."""

    async def burst():
        guests = [ChatClient(base_url) for _ in range(4)]
        try:
            conversations = []
            for n in range(count):
                guest = guests[n % len(guests)]
                conversations.append((guest, await guest.new_conversation()))
            await asyncio.gather(
                *(guest.ask(c, f"Question {n}") for n, (guest, c) in enumerate(conversations))
            )
        finally:
            for guest in guests:
                await guest.http.aclose()

    asyncio.run(burst())


def test_a_visitor_is_sent_to_sign_in_and_a_customer_is_refused(browser, stack):
    page = new_page(browser, stack.base_url)
    page.goto("/console/")
    expect(page).to_have_url(f"{stack.base_url}/accounts/login/?next=/console/")
    sign_in(page, "alice", "alice-demo-pass", next_url="/console/")
    response = page.goto("/console/canary")
    assert response.status == 403
    expect(page.get_by_role("heading", name="Staff only")).to_be_visible()
    expect(page.get_by_role("link", name="Console")).to_have_count(0)
    page.context.close()


def test_the_dashboard_queue_depth_rises_under_load_and_falls_after(staff_page, stack):
    page = staff_page
    errors = js_errors(page)
    expect(page.locator("#queue-depth-total")).to_have_attribute("data-value", "0")
    load = threading.Thread(target=_send_burst, args=(stack.base_url, LOAD_MESSAGES))
    load.start()
    try:
        # The page refreshes itself every 2 s: no reload here.
        page.wait_for_function(
            "() => Number(document.getElementById('queue-depth-total').dataset.value) >= 10", timeout=60_000
        )
        peak = _queue_depth(page)
        expect(page.locator(f"tr[data-model='{MODEL}'][data-tier='normal'] [data-queued]")).not_to_have_text(
            "0"
        )
    finally:
        load.join()
    expect(page.locator("#queue-depth-total")).to_have_attribute("data-value", "0", timeout=60_000)
    assert peak >= 10
    # The queue-depth chart drew the burst from the workers' samples.
    expect(page.locator("figure[data-chart='queue_depth'] path.chart__line").first).to_be_attached()
    chart_label = page.locator("figure[data-chart='queue_depth'] svg").get_attribute("aria-label")
    assert "Peak: 0 jobs" not in chart_label
    assert errors == []


def test_a_worker_joining_and_draining_shows_on_an_open_dashboard_without_a_reload(staff_page, stack):
    page = staff_page
    errors = js_errors(page)
    # Pushed over the console's socket: while it is open the page does not poll.
    expect(page.locator("#live-status")).to_have_attribute("data-live", "socket")
    polls: list[str] = []
    page.on("request", lambda request: polls.append(request.url) if "/console/live" in request.url else None)
    workers = page.locator("section:has(#workers-heading) tbody tr")
    spare = workers.filter(has=page.get_by_role("cell", name="spare", exact=True))
    expect(spare).to_have_count(0)

    worker = stack.start_worker(INFERENCE_MODEL_NAME="spare")  # a model no variant names
    expect(spare).to_have_count(1)
    # The Drain form came in a snapshot rendered once for every tab; it posts with this page's token.
    spare.get_by_role("button", name="Drain").click()
    expect(page.get_by_role("status").filter(has_text="is draining")).to_be_visible()
    assert worker.wait(timeout_s=60) == 0
    expect(spare).to_have_count(0, timeout=30_000)
    assert polls == []
    assert errors == []


# The widths of a laptop, a small laptop and a tablet held sideways.
@pytest.mark.parametrize("width", [1280, 1024, 900])
def test_the_queues_table_stays_inside_its_card(staff_page, width):
    page = staff_page
    page.set_viewport_size({"width": width, "height": 900})
    card = page.locator("section:has(#queues-heading)")
    expect(card.locator(f"tr[data-model='{MODEL}']").first).to_be_attached()
    # Looked up inside one script run: a live update may replace the card between two calls.
    overrun = page.evaluate(
        """() => {
            const card = document.querySelector("#queues-heading").closest("section");
            const padding = parseFloat(getComputedStyle(card).paddingRight);
            const inner = card.getBoundingClientRect().right - padding;
            return card.querySelector("table").getBoundingClientRect().right - inner;
        }"""
    )
    assert overrun <= 0.5


def _variant_of_a_new_conversation(page: Page) -> str:
    page.goto("/")
    with page.expect_navigation():
        page.get_by_role("button", name="New chat").click()
    page.get_by_label("Your message").fill("Which model answers me?")
    page.keyboard.press("Enter")
    answer = page.locator(".bubble--assistant").last
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    return answer.locator(".bubble__variant").inner_text()


def _set_split(page: Page, percent: int) -> None:
    page.goto("/console/canary")
    page.get_by_label("Split (% of new conversations to the candidate)").fill(str(percent))
    page.get_by_role("button", name="Set split").click()
    expect(page.locator("#canary-split")).to_have_attribute("data-split", str(percent))


def _wait_for_variant(page: Page, variant: str, attempts: int = 5) -> list[str]:
    """Routing reads the split at most a second late: a new conversation soon gets `variant`."""
    seen = [_variant_of_a_new_conversation(page)]
    while seen[-1] != variant and len(seen) < attempts:
        seen.append(_variant_of_a_new_conversation(page))
    return seen


def test_moving_the_canary_split_changes_which_variant_answers_new_conversations(browser, staff_page, stack):
    console = staff_page
    console.goto("/console/canary")
    console.get_by_label("Candidate variant").select_option("candidate")
    console.get_by_label("Steps (% of new conversations)").fill("50, 100")
    console.get_by_label("Hold per step (seconds)").fill("3600")
    console.get_by_role("button", name="Start canary").click()
    expect(console.get_by_role("heading", name="Running: candidate against stable")).to_be_visible()

    # Customers are not shown the variant; a second staff session asks and reads it.
    customer = new_page(browser, stack.base_url)
    sign_in(customer, "sam", stack.staff_password)
    try:
        _set_split(console, 100)
        to_candidate = _wait_for_variant(customer, "candidate")
        assert to_candidate[-1] == "candidate"
        assert [_variant_of_a_new_conversation(customer) for _ in range(2)] == ["candidate"] * 2

        _set_split(console, 0)
        to_stable = _wait_for_variant(customer, "stable")
        assert to_stable[-1] == "stable"
        assert [_variant_of_a_new_conversation(customer) for _ in range(2)] == ["stable"] * 2
    finally:
        customer.context.close()

    console.get_by_role("button", name="Roll back").click()
    expect(console.get_by_role("heading", name="Start a canary")).to_be_visible()


@pytest.mark.security
def test_markup_pushed_into_the_channel_layer_shows_as_text_on_the_console(staff_page, stack):
    """Whoever reaches Redis can send to the console's group. What they send is shown as the
    characters it is, and no script of theirs runs in a staff page."""
    page = staff_page
    expect(page.locator("#live-status")).to_have_attribute("data-live", "socket")
    planted = '<img src=x onerror="window.planted = true">'
    fields = dict.fromkeys(["queued_total", "queued_note", "running_total", "tokens_per_s"], planted)
    worker = {
        "worker_id": "w1",
        "model": planted,
        "engine": planted,
        "simulated": False,
        "running": planted,
        "paused": 0,
        "vip_waiting": False,
        "kv_cache": planted,
        "memory": planted,
        "on_gpu": False,
        "heartbeat_age": planted,
        "draining": False,
        "spare": False,
        "drain_url": "/console/workers/w1/drain",
    }
    snapshot = {
        "fields": fields,
        "queued_total": 0,
        "refusing": False,
        "queues": [],
        "refusals": [{"reason": planted, "per_min": "1"}],
        "fleet": [],
        "warm_spares": 0,
        "workers": [worker],
        "charts": {"queue_depth": {}, "ttft_p95_ms": [], "tokens_per_s": []},
    }
    # What an older release sent, markup, beside the data: neither may become a page's HTML.
    message = {
        "type": "live.snapshot",
        "snapshot": snapshot,
        "html": f'<div id="live-summary">{planted}</div>',
    }
    layer = RedisChannelLayer(hosts=[stack.redis.url], prefix="llm:channels:")

    shown = threading.Event()

    async def send_until_shown() -> None:
        # Also the broadcaster's own snapshots come every second: keep sending until ours shows.
        for _ in range(80):
            if shown.is_set():
                return
            await layer.group_send(keys.CONSOLE_LIVE_GROUP, message)
            await asyncio.sleep(0.25)

    # In a thread of its own: Playwright's sync API holds this thread's event loop.
    sender = threading.Thread(target=asyncio.run, args=(send_until_shown(),))
    sender.start()
    try:
        expect(page.locator("#workers-rows td", has_text=planted).first).to_be_visible()
        assert page.locator("#live-tables img, #live-summary img").count() == 0
    finally:
        shown.set()
        sender.join()
    assert page.evaluate("window.planted") is None
