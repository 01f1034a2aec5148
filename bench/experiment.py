"""`python -m bench experiment`: an A/B experiment between two variants, decided by simulated
customers whose satisfaction depends on the answer, through the product's real path.

The product runs as real processes (web, worker, Redis, SQLite) with the demo help center. The
two arms are variants made from the stable one with another answer style (ARMS, or existing
variants by name), and staff start the experiment from the console. Simulated customers arrive a
few at a time, each a new guest or a signed-in account. A customer asks one conversation's first
question from the tuning questions in English (knowledge/questions/tuning.json), reads the
answer to its end, and judges it with a satisfaction function: by default, every fact the
question set expects is in the answer and no wrong one is. A
satisfied customer leaves. An unsatisfied one rates the answer down (signed in), then asks for
a person, or comes back with a new conversation asking again (and asks for a person if that
fails too). A simulated agent claims those waiting in the console's inbox, replies and
resolves; the customer rates the agent.

The experiment is read every few customers exactly as the console reads it
(chat.outcomes.experiment_results, here on the stack's database). Reading it again and again
and stopping at the first verdict would stop on flukes (the first run named an arm at 70
customers and took it back at 77): the experiment has picked once the console has named the
same arm at PICK_AFTER_READS reads in a row; the number of conversations it had at the first
of those reads is what it needed, and then no new customers come. A conversation counts as
resolved by the assistant once ASSISTANT_RESOLVED_WINDOW_S has passed without a hand-off, a
thumbs-down or the customer coming back: here a few seconds, not a day.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.client import Session
from bench.stack import UNLIMITED
from launcher.stack import Stack

if TYPE_CHECKING:
    from knowledge.quality import Turn

ROOT = Path(__file__).resolve().parent.parent
DEMO_HELP_CENTER = ROOT / "knowledge" / "demo_help_center"

# The arms this scenario can make from the stable variant: its answer style. An arm named
# otherwise must exist as a variant already.
ARMS: dict[str, dict[str, Any]] = {
    style: {"answer_style": style} for style in ("extractive", "verified", "generated")
}
SIGNED_IN_SHARE = 0.5  # of customers; only they can rate an answer down
PERSON_SHARE = 0.5  # of the unsatisfied, who ask for a person at once (the others come back)
EVALUATE_EVERY = 10  # customers
PICK_AFTER_READS = 3  # the same verdict, read after each of this many tens of customers
RESOLVED_WINDOW_S = 10.0
AGENT_REPLY_AFTER_S = 1.0
AGENT_RESOLVE_AFTER_S = 1.0
ANSWER_TIMEOUT_S = 300.0
PERSON_TIMEOUT_S = 120.0


def facts_satisfy(turn: Turn, answer: str) -> bool:
    """A customer is satisfied when the answer holds every fact they asked for and nothing the
    question set knows to be wrong. A question the help center cannot answer satisfies nobody:
    its honest answer is a decline, and the customer still needs a person."""
    from knowledge.quality import fact_holds

    if turn.expect != "answer":
        return False
    return all(fact_holds(fact, answer) for fact in turn.facts) and not any(
        fact_holds(wrong, answer) for wrong in turn.wrong
    )


Satisfaction = Callable[["Turn", str], bool]
SATISFACTIONS: dict[str, Satisfaction] = {"facts": facts_satisfy}


# --- the stack's side, read and written in this process ---------------------------------------------


def _variants_make(arms: list[str]) -> None:
    from scheduler.models import Variant

    stable = Variant.objects.get(name="stable")
    for name in arms:
        if name in ARMS and not Variant.objects.filter(name=name).exists():
            fields = {
                f.name: getattr(stable, f.name)
                for f in Variant._meta.fields
                if f.name not in {"id", "name", "updated_at"}
            }
            Variant.objects.create(name=name, **{**fields, **ARMS[name]})
        elif not Variant.objects.filter(name=name).exists():
            raise SystemExit(f"no variant {name!r}: name an existing one or one of {sorted(ARMS)}")


def _signed_in_cookie(username: str) -> str:
    """A session for a new account, as signing in makes one (no password to hash)."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    from accounts.models import User

    user = User.objects.create(username=username)
    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return store.session_key


def _answer_text(request_id: str) -> str:
    from scheduler.models import Generation

    return Generation.objects.filter(request_id=request_id).values_list("text", flat=True).first() or ""


def _results(experiment_id: int) -> dict[str, Any]:
    from chat.outcomes import experiment_results
    from scheduler.models import Experiment

    results = experiment_results(experiment=Experiment.objects.get(pk=experiment_id))
    return {
        "conversations": sum(arm.conversations for arm in results.arms),
        "better": results.better,
        "arms": [arm.as_dict() for arm in results.arms],
    }


# --- the people ----------------------------------------------------------------------------------


async def _csrf_headers(session: Session) -> dict[str, str]:
    return {"X-CSRFToken": session.csrf, "Accept": "application/json"}


class Customers:
    def __init__(self, stack: Stack, turns: list[Turn], satisfied: Satisfaction, seed: int) -> None:
        self.stack = stack
        self.turns = turns
        self.satisfied = satisfied
        self.rng = random.Random(seed)
        self.outcomes: Counter[str] = Counter()

    async def one(self, n: int) -> None:
        rng = random.Random(self.rng.random())
        session = Session(self.stack.base_url)
        try:
            if rng.random() < SIGNED_IN_SHARE:
                from django.conf import settings

                key = await asyncio.to_thread(_signed_in_cookie, f"customer-{n}-{rng.getrandbits(32):x}")
                session.cookies[settings.SESSION_COOKIE_NAME] = key
                signed_in = True
            else:
                signed_in = False
            await session.open_page()
            turn = rng.choice(self.turns)
            for attempt in (1, 2):
                conversation = await session.new_conversation()
                posted = await session.post_message(conversation, turn.question)
                if posted.status != 202:
                    self.outcomes[f"refused {posted.status}"] += 1
                    return
                answer = posted.json()
                await session.stream(answer["stream_url"], timeout_s=ANSWER_TIMEOUT_S)
                text = await asyncio.to_thread(_answer_text, answer["request_id"])
                if self.satisfied(turn, text):
                    self.outcomes["satisfied" if attempt == 1 else "satisfied on coming back"] += 1
                    return
                if signed_in:
                    await session.request(
                        "POST",
                        f"/chat/messages/{answer['message_id']}/feedback",
                        form={"value": "down"},
                        headers=await _csrf_headers(session),
                    )
                if attempt == 2 or rng.random() < PERSON_SHARE:
                    await self._person(session, conversation, rng, signed_in=signed_in)
                    return
                self.outcomes["came back"] += 1
        finally:
            session.close()

    async def _person(
        self, session: Session, conversation: str, rng: random.Random, *, signed_in: bool
    ) -> None:
        trigger = "thumbs_down" if signed_in else "button"
        asked = await session.request(
            "POST",
            f"/chat/{conversation}/handoff/request",
            form={"trigger": trigger},
            headers=await _csrf_headers(session),
        )
        if asked.status != 201:
            self.outcomes[f"hand-off refused {asked.status}"] += 1
            return
        deadline = time.monotonic() + PERSON_TIMEOUT_S
        while time.monotonic() < deadline:
            state = (
                await session.request(
                    "GET", f"/chat/{conversation}/handoff", headers={"Accept": "application/json"}
                )
            ).json()
            if state["rate_handoff"]:
                await session.request(
                    "POST",
                    f"/chat/{conversation}/handoff/rating",
                    form={"rating": str(rng.choice([3, 4, 5, 5]))},
                    headers=await _csrf_headers(session),
                )
                self.outcomes["helped by a person"] += 1
                return
            await asyncio.sleep(0.5)
        self.outcomes["no person in time"] += 1


async def _agent(stack: Stack, stop: asyncio.Event) -> Counter[str]:
    """An agent in the console's inbox: claims whoever waits, replies, resolves."""
    done: Counter[str] = Counter()
    session = Session(stack.base_url)
    await session.login("sam", stack.staff_password)

    async def serve(conversation_id: str) -> None:
        # A connection of its own (a Session has one), signed in as the same agent.
        desk = Session(stack.base_url)
        desk.cookies.update(session.cookies)
        headers = await _csrf_headers(desk)
        try:
            claimed = await desk.request("POST", f"/console/inbox/{conversation_id}/claim", headers=headers)
            if claimed.status != 200:
                return
            await asyncio.sleep(AGENT_REPLY_AFTER_S)
            reply = {"text": "Hello, I'm Sam from the team: here is what you asked for."}
            await desk.request("POST", f"/console/inbox/{conversation_id}/reply", form=reply, headers=headers)
            await asyncio.sleep(AGENT_RESOLVE_AFTER_S)
            await desk.request("POST", f"/console/inbox/{conversation_id}/resolve", headers=headers)
            done["resolved"] += 1
        finally:
            desk.close()

    serving: dict[str, asyncio.Task[None]] = {}
    while not stop.is_set():
        inbox = (
            await session.request("GET", "/console/inbox/snapshot", headers={"Accept": "application/json"})
        ).json()
        for row in inbox["waiting"]:
            if row["id"] not in serving:
                serving[row["id"]] = asyncio.create_task(serve(row["id"]))
        await asyncio.sleep(0.5)
    await asyncio.gather(*serving.values(), return_exceptions=True)
    session.close()
    return done


async def _run(
    stack: Stack, experiment_id: int, customers: Customers, *, total: int, concurrency: int, keep_going: bool
) -> dict[str, Any]:
    stop_agent = asyncio.Event()
    agent = asyncio.create_task(_agent(stack, stop_agent))
    evaluations: list[dict[str, Any]] = []
    picked: dict[str, Any] | None = None
    streak: list[dict[str, Any]] = []  # the latest reads that named the same arm
    launched = finished = 0
    running: set[asyncio.Task[None]] = set()
    started = time.monotonic()
    while launched < total or running:
        while launched < total and len(running) < concurrency and (picked is None or keep_going):
            running.add(asyncio.create_task(customers.one(launched)))
            launched += 1
        if not running:
            break
        done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        finished += len(done)
        if finished % EVALUATE_EVERY < len(done) or not running:
            now = await asyncio.to_thread(_results, experiment_id)
            now["customers"] = finished
            now["elapsed_s"] = round(time.monotonic() - started, 1)
            evaluations.append(now)
            arms = "  ".join(
                f"{arm['label']}: {arm['conversations']} conv, resolved "
                f"{_pct(arm['resolved_by_assistant'])} of {arm['decided']} decided"
                for arm in now["arms"]
            )
            print(f"  {finished:4} customers  {arms}  better: {now['better'] or '-'}", flush=True)
            if not now["better"] or (streak and streak[0]["better"] != now["better"]):
                streak = []
            if now["better"]:
                streak.append(now)
            if picked is None and len(streak) >= PICK_AFTER_READS:
                picked = streak[0]
    # Let the last conversations be decided, then read the experiment once more.
    await asyncio.sleep(RESOLVED_WINDOW_S + 1)
    final = await asyncio.to_thread(_results, experiment_id)
    stop_agent.set()
    agent_done = await agent
    return {
        "customers": finished,
        "customer_outcomes": dict(customers.outcomes),
        "agent": dict(agent_done),
        "picked": _verdict(picked),
        "first_named": _verdict(next((read for read in evaluations if read["better"]), None)),
        "evaluations": evaluations,
        "final": final,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def _verdict(read: dict[str, Any] | None) -> dict[str, Any] | None:
    if read is None:
        return None
    return {"better": read["better"], "conversations": read["conversations"], "customers": read["customers"]}


def _pct(interval: dict[str, Any]) -> str:
    if interval["value"] is None:
        return "-"
    if not interval["enough"]:
        return f"{interval['value'] * 100:.0f}% (not enough)"
    return f"{interval['value'] * 100:.0f}% ({interval['low'] * 100:.0f}-{interval['high'] * 100:.0f}%)"


def experiment(
    *,
    arms: list[str],
    engine: str,
    customers: int,
    concurrency: int,
    satisfaction: str = "facts",
    seed: int = 1,
    keep_going: bool = False,
) -> dict[str, Any]:
    stack = Stack(
        Path(tempfile.mkdtemp(prefix="bench-experiment-")),
        **{**UNLIMITED, "INFERENCE_ENGINE": engine, "GUEST_ADDRESS_BUCKET_FACTOR": "100000"},
    )
    print(f"  starting the product ({engine} engine)...", flush=True)
    stack.start()
    try:
        os.environ.update(
            DATABASE_URL=stack.database_url,
            REDIS_URL=stack.redis.url,
            ASSISTANT_RESOLVED_WINDOW_S=str(RESOLVED_WINDOW_S),
        )
        import django

        django.setup()
        from knowledge.quality import conversations_load

        turns = [c.turns[0] for c in conversations_load(["tuning"]) if c.language == "en"]
        for command in (
            ["import_articles", str(DEMO_HELP_CENTER)],
            ["agent", "sam", "--display-name", "Sam", "--capacity", "20"],
        ):
            done = stack.manage(*command)
            if done.returncode != 0:
                raise RuntimeError(f"manage.py {command[0]} failed: {done.stderr}")
        _variants_make(arms)
        experiment_id = asyncio.run(_start(stack, arms))
        print(
            f"  experiment {arms[0]} against {arms[1]}, {len(turns)} first questions of the tuning set",
            flush=True,
        )
        people = Customers(stack, turns, SATISFACTIONS[satisfaction], seed)
        run = asyncio.run(
            _run(
                stack, experiment_id, people, total=customers, concurrency=concurrency, keep_going=keep_going
            )
        )
    finally:
        stack.stop()
    return {
        "arms": arms,
        "engine": engine,
        "satisfaction": satisfaction,
        "questions": "knowledge/questions/tuning.json, first turns in English",
        "concurrency": concurrency,
        "seed": seed,
        "resolved_window_s": RESOLVED_WINDOW_S,
        **run,
    }


async def _start(stack: Stack, arms: list[str]) -> int:
    """Staff start the experiment in the console, half the customers on each arm."""
    from scheduler.models import Experiment

    staff = Session(stack.base_url)
    await staff.login("sam", stack.staff_password)
    started = await staff.request(
        "POST",
        "/console/experiments/start",
        form={"variant_a": arms[0], "variant_b": arms[1], "split_percent": "50"},
        headers={"X-CSRFToken": staff.csrf},
    )
    staff.close()
    if started.status != 302:
        raise RuntimeError(f"the console refused the experiment: {started.status} {started.body[:500]!r}")
    return await asyncio.to_thread(lambda: Experiment.objects.get(status=Experiment.Status.RUNNING).pk)
