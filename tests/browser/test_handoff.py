"""The hand-off in real browsers: a customer and an agent, each in a chromium context of their
own, on the real processes. Asking by the button and in words, the agent's reply in the
customer's page, typing both ways, a reload on each side, the rating; two agents claiming at
once; nobody online."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from playwright.sync_api import Browser, Page, expect

from scheduler import keys
from tests.browser.conftest import js_errors, new_page, sign_in
from tests.e2e.conftest import running_stack

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture(autouse=True, scope="module")
def _patient_expectations():
    """Two browsers and the stack share two busy cores: give each expectation time."""
    expect.set_options(timeout=15_000)
    yield
    expect.set_options(timeout=5_000)


DEMO_HELP_CENTER = Path(__file__).resolve().parents[2] / "knowledge" / "demo_help_center"
ANA_PASSWORD = "ana-agent-pass"


@pytest.fixture(scope="module")
def stack():
    for stack in running_stack(SIMULATED_OUTPUT_TOKENS="12", SIMULATED_DECODE_BASE_S="0.02"):
        done = stack.manage("agent", "sam", "--display-name", "Sam")
        assert done.returncode == 0, done.stderr
        made = stack.manage(
            "shell",
            "-c",
            "from accounts.models import User; "
            f"User.objects.create_user('ana', password={ANA_PASSWORD!r}, is_staff=True)",
        )
        assert made.returncode == 0, made.stderr
        assert stack.manage("agent", "ana", "--display-name", "Ana").returncode == 0
        # Off-topic questions get the help center's honest "we don't know", which offers a person.
        imported = stack.manage("import_articles", str(DEMO_HELP_CENTER))
        assert imported.returncode == 0, imported.stderr
        yield stack


@pytest.fixture(autouse=True)
def _close_pages(browser: Browser):
    """A failing test leaves no tab behind: an agent's open tab would count as online."""
    yield
    for context in browser.contexts:
        context.close()


def _agent(browser: Browser, stack, username: str = "sam", password: str | None = None) -> Page:
    page = new_page(browser, stack.base_url)
    sign_in(page, username, password or stack.staff_password, next_url="/console/inbox")
    expect(page.locator("#inbox-presence")).to_contain_text("You are online")
    return page


def _customer(browser: Browser, stack) -> Page:
    page = new_page(browser, stack.base_url)
    page.goto("/")
    return page


def _ask(page: Page, text: str) -> None:
    page.get_by_label("Your message").fill(text)
    page.keyboard.press("Enter")


def _answered(page: Page, text: str) -> None:
    answers = page.locator(".bubble--assistant")
    before = answers.count()
    _ask(page, text)
    expect(answers).to_have_count(before + 1)
    expect(answers.last).to_have_attribute("data-status", "done")


def _talk_to_a_person(customer: Page) -> None:
    """The button under the chat (a decline offers its own as well)."""
    panel = customer.get_by_role("region", name="A person from our team")
    panel.get_by_role("button", name="Talk to a person").click()


def _open_waiting(agent: Page, customer_text: str) -> None:
    item = agent.locator("#inbox-waiting .inbox-item", has_text=customer_text).first
    expect(item).to_be_visible()
    item.get_by_role("button").click()
    expect(agent.locator("#transcript")).to_contain_text(customer_text)


def test_a_customer_hands_off_by_the_button_talks_with_an_agent_through_reloads_and_rates(browser, stack):
    agent = _agent(browser, stack)
    customer = _customer(browser, stack)
    customer_errors, agent_errors = js_errors(customer), js_errors(agent)

    _answered(customer, "Where is parcel 4411?")
    answer = customer.locator(".bubble--assistant .bubble__content").last.inner_text()
    _talk_to_a_person(customer)
    expect(customer.locator("#handoff-status")).to_contain_text("You are number 1 in line")

    # The agent sees it waiting, offered to them, with the whole conversation so far.
    item = agent.locator("#inbox-waiting .inbox-item", has_text="Where is parcel 4411?")
    expect(item).to_contain_text("Offered to you")
    _open_waiting(agent, "Where is parcel 4411?")
    # The assistant could not look the parcel up, and said so; the agent reads what it said.
    expect(agent.locator("#transcript .transcript__item--assistant")).to_contain_text(answer.split("\n")[0])
    agent.get_by_role("button", name="Claim").click()
    expect(agent.locator("#conversation-state")).to_contain_text("You are answering")
    expect(customer.locator("#handoff-status")).to_have_text("You are talking to Sam from our team.")

    # Typing, both ways.
    agent.get_by_label("Your message").press_sequentially("Hel")
    expect(customer.locator("#handoff-typing")).to_have_text("Sam is typing…")
    customer.get_by_label("Your message").press_sequentially("It is")
    expect(agent.locator("#customer-typing")).to_be_visible()

    # The agent's reply appears in the customer's page, under the agent's display name.
    agent.get_by_label("Your message").fill("Hello, I'm Sam. Let me look at parcel 4411.")
    agent.get_by_role("button", name="Send to the customer").click()
    reply = customer.locator(".bubble--agent")
    expect(reply).to_contain_text("Hello, I'm Sam.")
    expect(reply.locator(".bubble__author")).to_have_text("Sam")
    expect(customer.locator("#handoff-typing")).to_be_hidden()

    # The customer's answer reaches the agent; no assistant answers it.
    customer.get_by_label("Your message").fill("It is three days late.")
    customer.keyboard.press("Enter")
    expect(agent.locator("#transcript")).to_contain_text("It is three days late.")
    assert customer.locator(".bubble--assistant").count() == 1

    # A reload on each side: nothing lost, nothing twice, and the live path still works.
    customer.reload()
    agent.reload()
    expect(customer.locator(".bubble--agent")).to_have_count(1)
    expect(customer.locator("#handoff-status")).to_have_text("You are talking to Sam from our team.")
    expect(agent.locator("#transcript")).to_contain_text("It is three days late.")
    agent.get_by_label("Your message").fill("It is on its way: tomorrow by noon.")
    agent.get_by_role("button", name="Send to the customer").click()
    expect(customer.locator(".bubble--agent")).to_have_count(2)
    expect(customer.locator(".bubble--agent").last).to_contain_text("tomorrow by noon")

    # A private note stays with the team.
    agent.get_by_label("Your message").fill("Courier confirmed by phone.")
    agent.get_by_role("button", name="Add a private note").click()
    expect(agent.locator(".transcript__item--note")).to_contain_text("Courier confirmed by phone.")

    # Resolved: the customer is asked for a rating, once.
    agent.get_by_role("button", name="Resolve").click()
    rating = customer.locator("#handoff-rating")
    expect(rating).to_be_visible()
    rating.get_by_label("5").check()
    rating.get_by_label("A comment (optional)").fill("Quick and kind.")
    rating.get_by_role("button", name="Send rating").click()
    expect(customer.locator("#handoff-status")).to_have_text("Thank you for your rating.")
    customer.reload()
    expect(customer.locator("#handoff-rating")).to_be_hidden()
    assert "Courier confirmed" not in customer.content()
    rows = stack.db_rows("SELECT rating, rating_comment, outcome FROM chat_handoff ORDER BY id DESC LIMIT 1")
    assert rows == [{"rating": 5, "rating_comment": "Quick and kind.", "outcome": "resolved"}]
    assert customer_errors == [] and agent_errors == []
    for page in (agent, customer):
        page.context.close()


def test_asking_in_words_hands_off_without_an_answer(browser, stack):
    agent = _agent(browser, stack)
    customer = _customer(browser, stack)
    _ask(customer, "Je voudrais parler à un conseiller")
    expect(customer.locator("#handoff-status")).to_contain_text("Waiting for a person")
    expect(customer.locator(".bubble--user")).to_contain_text("Je voudrais parler à un conseiller")
    expect(customer.locator(".bubble--assistant")).to_have_count(0)
    _open_waiting(agent, "Je voudrais parler à un conseiller")
    agent.get_by_role("button", name="Claim").click()
    expect(customer.locator("#handoff-status")).to_have_text("You are talking to Sam from our team.")
    # An empty or over-long message is refused in words, and what was typed stays in the box.
    box = agent.get_by_label("Your message")
    agent.get_by_role("button", name="Send to the customer").click()
    expect(agent.locator("#inbox-error")).to_have_text("Type a message first.")
    box.fill("x" * 4001)
    agent.get_by_role("button", name="Send to the customer").click()
    expect(agent.locator("#inbox-error")).to_contain_text("at most 4000 characters (this one has 4001)")
    expect(box).to_have_value("x" * 4001)
    expect(customer.locator(".bubble--agent")).to_have_count(0)
    box.fill("")
    agent.get_by_role("button", name="Hand back to the assistant").click()
    expect(customer.locator("#handoff-status")).to_have_text("You are back with the assistant.")
    _answered(customer, "Do gift cards expire?")
    for page in (agent, customer):
        page.context.close()


def test_a_decline_and_a_second_thumbs_down_offer_a_person(browser, stack):
    customer = new_page(browser, stack.base_url)
    sign_in(customer, "alice", "alice-demo-pass")  # only signed-in customers vote
    customer.get_by_role("button", name="New chat").click()
    _answered(customer, "What is the capital of Mongolia?")  # nothing in the help center
    offer = customer.locator(".bubble--assistant").last.locator(".bubble__offer")
    expect(offer).to_be_visible()
    expect(customer.locator("#handoff-offer")).to_be_hidden()
    for question in ("Can I change my delivery address?", "Do you ship to Canada?"):
        _answered(customer, question)
        customer.locator(".bubble--assistant").last.get_by_role("button", name="Not helpful").click()
    expect(customer.locator("#handoff-offer")).to_be_visible()
    customer.locator("#handoff-offer").get_by_role("button", name="Talk to a person").click()
    expect(customer.locator("#handoff")).to_have_attribute("data-state", "waiting")
    assert stack.db_rows("SELECT trigger FROM chat_handoff ORDER BY id DESC LIMIT 1") == [
        {"trigger": "thumbs_down"}
    ]
    customer.context.close()


def _claim_at_once(stack, pages: list[Page], conversation_id: str) -> list[int]:
    """Both POSTs leave together (Playwright's event loop runs in this thread: plain threads)."""
    sessions = [{c["name"]: c["value"] for c in page.context.cookies()} for page in pages]
    together = threading.Barrier(len(sessions))
    statuses: list[int] = []

    def claim(cookies: dict[str, str]) -> None:
        with httpx.Client(base_url=stack.base_url, cookies=cookies, timeout=30) as client:
            together.wait()
            response = client.post(
                f"/console/inbox/{conversation_id}/claim",
                headers={"X-CSRFToken": cookies["csrftoken"], "Accept": "application/json"},
            )
            statuses.append(response.status_code)

    threads = [threading.Thread(target=claim, args=(cookies,)) for cookies in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(statuses)


def _handed_off(browser: Browser, stack, question: str) -> Page:
    customer = _customer(browser, stack)
    _answered(customer, question)
    _talk_to_a_person(customer)
    expect(customer.locator("#handoff-status")).to_contain_text("Waiting for a person")
    return customer


def test_two_agents_claiming_at_once_one_gets_it_and_the_other_is_told(browser, stack):
    sam, ana = _agent(browser, stack), _agent(browser, stack, "ana", ANA_PASSWORD)
    agents = {"sam": sam, "ana": ana}

    # Two requests at the same moment: one 200, one 409.
    first = _handed_off(browser, stack, "Has order 7788 shipped?")
    for agent in agents.values():
        _open_waiting(agent, "Has order 7788 shipped?")
    assert _claim_at_once(stack, [sam, ana], sam.url.split("c=")[1]) == [200, 409]
    (winner,) = stack.db_rows(
        "SELECT u.username FROM chat_conversation c JOIN chat_user u ON u.id = c.assignee_id"
    )
    loser = ana if winner["username"] == "sam" else sam
    expect(loser.locator("#conversation-state")).to_contain_text("is answering.")  # heard live
    expect(loser.get_by_role("button", name="Claim")).to_be_hidden()

    # Two clicks at once in the pages: the one that lost says so, in words.
    second = _handed_off(browser, stack, "Can order 9900 be sent to my office?")
    for agent in agents.values():
        _open_waiting(agent, "Can order 9900 be sent to my office?")
    for agent in agents.values():
        agent.evaluate("document.getElementById('claim-button').click()")
    told = [
        agent
        for agent in agents.values()
        if agent.locator("#inbox-error")
        .filter(has_text="Another agent is answering this conversation already.")
        .or_(agent.locator("#conversation-state").filter(has_text="You are answering"))
        .first.wait_for()
        is None
        and agent.locator("#inbox-error").is_visible()
    ]
    assert len(told) == 1
    expect(second.locator("#handoff-status")).to_contain_text("from our team.")
    for page in (sam, ana, first, second):
        page.context.close()


def _nobody_online(stack) -> None:
    """Wait for the agents' tabs of earlier tests to have left (a closed tab leaves at once,
    once its socket's close reaches the web process)."""
    presence = redis.Redis.from_url(stack.redis.url)
    deadline = time.monotonic() + 10
    while presence.zcard(keys.AGENTS_PRESENCE) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert presence.zcard(keys.AGENTS_PRESENCE) == 0


def test_with_nobody_online_the_customer_leaves_a_question_and_finds_the_reply_on_coming_back(browser, stack):
    _nobody_online(stack)
    customer = new_page(browser, stack.base_url)
    sign_in(customer, "victor", "victor-demo-pass")
    customer.get_by_role("button", name="New chat").click()
    _talk_to_a_person(customer)
    expect(customer.locator("#handoff-status")).to_contain_text("Nobody from our team is online right now")
    _ask(customer, "Please call me about my broken lamp, order 5512.")
    expect(customer.locator(".bubble--user")).to_contain_text("broken lamp")
    customer.context.close()  # gone before anyone came

    agent = _agent(browser, stack)
    item = agent.locator("#inbox-waiting .inbox-item", has_text="broken lamp")
    expect(item).to_contain_text("Left a question while nobody was online")
    expect(item).to_contain_text("VIP")
    _open_waiting(agent, "broken lamp")
    agent.get_by_role("button", name="Claim").click()
    agent.get_by_label("Your message").fill("Sorry about the lamp: a replacement ships today.")
    agent.get_by_role("button", name="Send to the customer").click()
    expect(agent.locator("#transcript")).to_contain_text("replacement ships today")
    agent.context.close()

    # Back on another device: the reply is in the conversation.
    again = new_page(browser, stack.base_url)
    sign_in(again, "victor", "victor-demo-pass")
    expect(again.locator(".bubble--agent")).to_contain_text("a replacement ships today")
    expect(again.locator("#handoff-status")).to_have_text("You are talking to Sam from our team.")
    again.context.close()
