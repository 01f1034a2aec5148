import asyncio
import json

from chat.relay import relay_events
from scheduler import keys
from scheduler.generation import Done, Start, Timings, Token
from scheduler.redis import new_async_redis
from scheduler.results import ResultPublisher


def _events(stream: bytes) -> list[dict[str, str]]:
    """The stream's events as an EventSource reads them: one field per line."""
    events = []
    for block in stream.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "event" in fields:
            events.append(fields)
    return events


async def _relayed(request_id: str) -> bytes:
    stream = b""
    async for frame in relay_events(model="v", request_id=request_id, after_id="0-0"):
        stream += frame
    return stream


def test_the_relay_sends_each_token_with_its_id_as_the_browser_reads_it():
    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        try:
            publisher.emit("v", "answer", Start(worker="w", variant="stable", attempt=1))
            await publisher.emit("v", "answer", Token(seq=0, text="Two\nlines "))
            await publisher.emit("v", "answer", Token(seq=1, text="«fin»"))
            await publisher.emit("v", "answer", Done(finish_reason="stop"))
            relayed = await asyncio.wait_for(_relayed("answer"), 30)
            ids = [entry_id for entry_id, _ in await client.xrange(keys.result("v", "answer"))]
            return relayed, ids
        finally:
            publishing.cancel()
            await client.aclose()

    relayed, ids = asyncio.run(scenario())
    events = _events(relayed)
    assert [e["event"] for e in events] == ["status", "token", "token", "done"]
    assert [e["id"] for e in events] == ids
    assert [json.loads(e["data"]) for e in events[1:3]] == [
        {"seq": 0, "text": "Two\nlines ", "tokens": 1},
        {"seq": 1, "text": "«fin»", "tokens": 1},
    ]


def test_the_browser_learns_the_kind_of_engine_but_not_the_model_that_answered():
    """During a canary on another model, the model's name would say which variant answered."""

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        timings = Timings(queue_ms=1.0, ttft_ms=2.0, duration_ms=3.0, engine="vllm:Candidate-Model-7B")
        try:
            await publisher.emit("v", "model", Done(finish_reason="stop", timings=timings))
            return await asyncio.wait_for(_relayed("model"), 30)
        finally:
            publishing.cancel()
            await client.aclose()

    relayed = asyncio.run(scenario())
    [done] = [e for e in _events(relayed) if e["event"] == "done"]
    assert json.loads(done["data"])["timings"]["engine"] == "vllm"
    assert b"Candidate-Model" not in relayed


def test_a_token_stored_across_lines_still_reaches_the_browser_as_one_event():
    async def scenario():
        client = new_async_redis()
        stream = keys.result("v", "pretty")
        try:
            # Written by hand, pretty-printed: JSON allows line breaks between its parts, SSE
            # would read each line as a field of its own.
            await client.xadd(stream, {"type": "token", "data": '{\n  "seq": 0,\r\n  "text": "Hi"\n}'})
            await client.xadd(stream, {"type": "done", "data": json.dumps({"finish_reason": "stop"})})
            return await asyncio.wait_for(_relayed("pretty"), 30)
        finally:
            await client.aclose()

    events = _events(asyncio.run(scenario()))
    assert [e["event"] for e in events] == ["token", "done"]
    assert json.loads(events[0]["data"]) == {"seq": 0, "text": "Hi"}
