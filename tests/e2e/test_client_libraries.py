"""Real client libraries against /v1 (simulated engine): the official `openai` client and
LangChain's `ChatOpenAI`, as people point them at an OpenAI-compatible server, including JSON
mode and a named tool choice, whose simulated answers these clients must be able to parse.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.generation_jobs import ORDER_TOOL

pytestmark = pytest.mark.e2e

QUESTION = "Where is my parcel?"
ECHO = "[simulated] You asked: Where is my parcel?"


@pytest.fixture(scope="module")
def api_key(stack) -> str:
    return stack.create_api_key("victor")


@pytest.fixture
def openai_client(stack, api_key) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=api_key, max_retries=0)


@pytest.fixture
def langchain_model(stack, api_key) -> ChatOpenAI:
    return ChatOpenAI(
        model="stable",
        base_url=stack.base_url + "/v1",
        api_key=api_key,
        max_tokens=12,
        max_retries=0,
        stream_usage=True,
    )


def test_openai_json_mode_answers_a_json_object(openai_client):
    completion = openai_client.chat.completions.create(
        model="stable",
        messages=[{"role": "user", "content": "Give the order id 12345 as JSON."}],
        response_format={"type": "json_object"},
        max_tokens=32,
    )
    assert isinstance(json.loads(completion.choices[0].message.content), dict)


def test_openai_a_named_tool_choice_answers_a_call_of_that_tool(openai_client):
    completion = openai_client.chat.completions.create(
        model="stable",
        messages=[{"role": "user", "content": "Where is my order 12345?"}],
        tools=[ORDER_TOOL],
        tool_choice={"type": "function", "function": {"name": "order_status"}},
        max_tokens=32,
    )
    [choice] = completion.choices
    [call] = choice.message.tool_calls
    assert call.function.name == "order_status"
    assert isinstance(json.loads(call.function.arguments), dict)
    assert choice.finish_reason in {"tool_calls", "stop"}


def test_langchain_invoke_returns_the_answer_with_usage(langchain_model):
    message = langchain_model.invoke(QUESTION)
    assert message.content.startswith(ECHO)
    assert message.response_metadata["finish_reason"] == "length"
    assert message.usage_metadata["output_tokens"] == 12
    assert message.usage_metadata["total_tokens"] == message.usage_metadata["input_tokens"] + 12


def test_langchain_stream_yields_the_answer_in_chunks_then_usage(langchain_model):
    chunks = list(langchain_model.stream(QUESTION))
    assert len([chunk for chunk in chunks if chunk.content]) > 1
    whole = sum(chunks[1:], chunks[0])
    assert isinstance(whole, AIMessageChunk)
    assert whole.content.startswith(ECHO)
    assert whole.response_metadata["finish_reason"] == "length"
    assert whole.usage_metadata["output_tokens"] == 12


async def _astream(model: ChatOpenAI) -> list[AIMessageChunk]:
    return [chunk async for chunk in model.astream(QUESTION)]


def test_langchain_async_stream_yields_the_same_answer(langchain_model):
    chunks = asyncio.run(_astream(langchain_model))
    assert "".join(chunk.content for chunk in chunks).startswith(ECHO)


def test_langchain_json_mode_parses_the_answer(langchain_model):
    structured = langchain_model.bind(max_tokens=32).with_structured_output(method="json_mode")
    assert isinstance(structured.invoke("Give the order id 12345 as JSON."), dict)


def test_langchain_bound_tool_answers_a_tool_call(langchain_model):
    with_tool = langchain_model.bind_tools([ORDER_TOOL], tool_choice="order_status")
    message = with_tool.invoke("Where is my order 12345?")
    [call] = message.tool_calls
    assert call["name"] == "order_status"
    assert isinstance(call["args"], dict)
