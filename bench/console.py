"""`python -m bench console`: staff tabs polling against the live socket."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import psutil

from bench.client import Session
from bench.stack import UNLIMITED, running
from bench.stats import distribution
from scheduler import keys

CONSOLE_POLL_S = 2.0  # the htmx fallback's interval (templates/admin_console/_live_summary.html)


async def _poll_tab(session: Session, seen: dict[str, float], stop_at: float, markers: list[str]) -> None:
    """A tab polling /console/live as htmx does, from a random phase."""
    await asyncio.sleep(random.uniform(0, CONSOLE_POLL_S))
    while time.time() < stop_at:
        started = time.time()
        body = (await session.request("GET", "/console/live", headers={"HX-Request": "true"})).body
        for marker in markers:
            if marker not in seen and marker.encode() in body:
                seen[marker] = time.time()
        await asyncio.sleep(max(0.0, CONSOLE_POLL_S - (time.time() - started)))


async def _socket_tab(
    base_url: str, cookie: str, seen: dict[str, float], stop_at: float, markers: list[str]
) -> None:
    import websockets

    url = base_url.replace("http://", "ws://") + "/console/live/socket"
    headers = {"Cookie": cookie, "Origin": base_url}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as socket:
        while time.time() < stop_at:
            try:
                snapshot = await asyncio.wait_for(socket.recv(), timeout=max(0.1, stop_at - time.time()))
            except TimeoutError:
                break
            for marker in markers:
                if marker not in seen and marker in snapshot:
                    seen[marker] = time.time()


def console(*, tabs: list[int], window_s: float, refusals: int) -> dict:
    """Staff tabs on the live dashboard, polling (htmx, every 2 s) against the socket (one pushed
    snapshot per second): the web process's CPU, Redis commands per second, and the time from a
    refusal being recorded to each tab holding it."""
    import redis as sync_redis_lib

    env = {**UNLIMITED, "INFERENCE_ENGINE": "simulated"}
    import django

    django.setup()
    from scheduler import timeseries  # its module reaches the models: once Django is set up

    rows: dict[str, dict] = {}
    with running(env) as stack:
        web = psutil.Process(stack.web.pid)
        store = sync_redis_lib.Redis.from_url(stack.redis.url, decode_responses=True)

        def record_refusal(reason: str) -> float:
            # What admission writes on a refusal (scheduler.timeseries.refusal_record).
            now = time.time()
            store.hincrby(keys.series_bucket(timeseries.bucket_start(now)), f"refused:{reason}", 1)
            return now

        async def measure(mode: str, count: int) -> dict:
            staff = Session(stack.base_url)
            await staff.login("sam", "sam-demo-pass")
            markers = [f"bench_{mode}_{count}_{n}_{uuid.uuid4().hex[:6]}" for n in range(refusals)]
            seen: list[dict[str, float]] = [{} for _ in range(count)]
            warmup_s = 3.0
            stop_at = time.time() + warmup_s + window_s
            if mode == "poll":
                sessions = [Session(stack.base_url) for _ in range(count)]
                for session in sessions:
                    session.cookies = dict(staff.cookies)
                tasks = [_poll_tab(s, seen[n], stop_at, markers) for n, s in enumerate(sessions)]
            else:
                cookie = "; ".join(f"{k}={v}" for k, v in staff.cookies.items())
                tasks = [_socket_tab(stack.base_url, cookie, seen[n], stop_at, markers) for n in range(count)]
            running_tabs = asyncio.gather(*tasks)
            await asyncio.sleep(warmup_s)
            cpu_before = sum(web.cpu_times()[:2])
            commands_before = int(store.info("stats")["total_commands_processed"])
            started = time.time()
            recorded = {}
            for n, marker in enumerate(markers):
                await asyncio.sleep(max(0.0, started + (n + 0.5) * window_s / refusals - time.time()))
                recorded[marker] = record_refusal(marker)
            await running_tabs
            elapsed = time.time() - started
            cpu = sum(web.cpu_times()[:2]) - cpu_before
            commands = int(store.info("stats")["total_commands_processed"]) - commands_before
            delays = [tab[m] - recorded[m] for tab in seen for m in markers if m in tab]
            missed = sum(1 for tab in seen for m in markers if m not in tab)
            return {
                "tabs": count,
                "mode": mode,
                "web_cpu_percent": round(100 * cpu / elapsed, 1),
                "redis_commands_per_s": round(commands / elapsed, 1),
                "refusal_to_tab_s": distribution(delays),
                "refusal_to_tab_max_s": round(max(delays), 3) if delays else None,
                "missed": missed,
            }

        idle_cpu = sum(web.cpu_times()[:2])
        idle_commands = int(store.info("stats")["total_commands_processed"])
        time.sleep(window_s)
        rows["idle"] = {
            "web_cpu_percent": round(100 * (sum(web.cpu_times()[:2]) - idle_cpu) / window_s, 1),
            "redis_commands_per_s": round(
                (int(store.info("stats")["total_commands_processed"]) - idle_commands) / window_s, 1
            ),
        }
        for count in tabs:
            for mode in ("poll", "socket"):
                row = asyncio.run(measure(mode, count))
                rows[f"{mode}-{count}"] = row
                print(
                    f"{mode:<6} tabs {count:3}  web CPU {row['web_cpu_percent']:5.1f} %  "
                    f"Redis {row['redis_commands_per_s']:7.1f} cmd/s  refusal→tab p50 "
                    f"{row['refusal_to_tab_s']['p50']:.2f} s max {row['refusal_to_tab_max_s']:.2f} s  "
                    f"missed {row['missed']}",
                    flush=True,
                )
    return {"window_s": window_s, "refusals_per_run": refusals, "rows": rows}
