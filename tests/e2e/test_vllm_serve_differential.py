"""The product's /v1/chat/completions and /v1/completions against `vllm serve` on the same
model and engine: each request of the table below goes to both, whole, streamed, and streamed
with usage, and the answers must agree field by field (`tests/e2e/openai_diff.py` says which
fields).

A parameter the product does not honour yet is a case marked xfail(strict): it fails while the
product refuses or ignores it, and the marker must go when support lands (a strict xfail that
passes fails the suite; markers use `raises=AssertionError`, so that a peer refusal still shows
as an error); none is left today. A request the peer itself refuses is an error, not
an expected failure: the table would be wrong.

Deliberate deviations, outside the compared fields:
- defaults: without `max_tokens` a chat answer has at most GENERATION_MAX_TOKENS tokens, and
  without `top_p` the product samples at GENERATION_TOP_P, where vLLM fills the context at
  top_p 1 (a text completion's `max_tokens` defaults to 16 on both; a left-out temperature is
  1 on both, not the chat's GENERATION_TEMPERATURE);
- both run the tool-call parser `pythonic` (the peer's `--tool-call-parser`, the stack's stable
  variant's `tool_call_parser`): it reads the Python list of calls the served model writes for
  `tool_choice: "auto"`, forces named and "required" choices with the JSON schema of vLLM's own
  tool-call structured output (as the product does) and needs no special tokens;
- in a stream the finish reason comes in a chunk of its own after the last text (vLLM puts it
  on the chunk with the last text), and a "required" choice's calls come whole once complete;
- `system_fingerprint` is null, and vLLM's extensions (`stop_reason`, `token_ids`...) are absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.e2e.openai_diff import differences, sse_chunks, stream_view, whole_view
from tests.generation_jobs import ORDER_TOOL

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

QUESTION = [{"role": "user", "content": "How do I reset my password?"}]
CONVERSATION = [
    {"role": "system", "content": "You are the support assistant of a parcel delivery company."},
    {"role": "user", "content": "My parcel has not arrived."},
    {"role": "assistant", "content": "I am sorry to hear that. Do you have the tracking number?"},
    {"role": "user", "content": "Yes, it is 12345. Where is it?"},
]
SHORT_ANSWER = [{"role": "user", "content": "Reply with the single word: yes."}]
# An earlier turn shows the format `pythonic` reads; the model then writes a call in it.
PYTHONIC_EXAMPLE = [
    {"role": "user", "content": "Where is my order 111?"},
    {"role": "assistant", "content": '[order_status(order_id="111")]'},
    {"role": "user", "content": "Where is my order 12345?"},
]
PROMPT = "Dear customer, thank you for your order. Your parcel"
# A function taking a nested model, as pydantic and LangChain write it: `$ref` into `$defs`.
SHIP_TOOL = {
    "type": "function",
    "function": {
        "name": "ship_order",
        "description": "Send an order to an address.",
        "parameters": {
            "$defs": {
                "Address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                }
            },
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "to": {"$ref": "#/$defs/Address"}},
            "required": ["order_id", "to"],
        },
    },
}
TIMEOUT_S = 120.0


class Tok(str):
    """A token of the served model's tokenizer, named by its text in a case's body."""


def _token_ids(value: Any) -> Any:
    """The body with every `Tok` (a key or a value) replaced by its token id."""
    if isinstance(value, Tok):
        from django.conf import settings
        from tokenizers import Tokenizer

        [token_id] = (
            Tokenizer.from_file(f"{settings.INFERENCE_MODEL}/tokenizer.json")
            .encode(value, add_special_tokens=False)
            .ids
        )
        return token_id
    if isinstance(value, dict):
        return {(str(_token_ids(k)) if isinstance(k, Tok) else k): _token_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_token_ids(v) for v in value]
    return value


@dataclass(frozen=True)
class Case:
    id: str
    body: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=lambda: QUESTION)
    prompt: str | None = None  # a text completion's (then `messages` is not sent)
    marks: tuple[pytest.MarkDecorator, ...] = ()
    # A stream without usage differs from one with it by the last chunk alone: one case checks it.
    modes: tuple[str, ...] = ("whole", "stream_with_usage")


CASES = [
    Case("greedy", {"temperature": 0, "max_tokens": 24}, modes=("whole", "stream", "stream_with_usage")),
    Case("max_completion_tokens", {"temperature": 0, "max_completion_tokens": 12}),
    Case("conversation", {"temperature": 0, "max_tokens": 24}, messages=CONVERSATION),
    Case("eos_before_max_tokens", {"temperature": 0, "max_tokens": 64}, messages=SHORT_ANSWER),
    Case("stop_string", {"temperature": 0, "max_tokens": 48, "stop": " password"}),
    Case("stop_list", {"temperature": 0, "max_tokens": 48, "stop": ["zzz", ","]}),
    Case("top_p_under_greedy", {"temperature": 0, "top_p": 0.5, "max_tokens": 16}),
    # Sampled cases name top_p: the product's default (GENERATION_TOP_P) is not vLLM's 1.
    Case("seed", {"temperature": 1.0, "top_p": 1.0, "seed": 1234, "max_tokens": 24}),
    Case("n", {"temperature": 1.0, "top_p": 1.0, "seed": 7, "n": 2, "max_tokens": 16}),
    # top_k=1 is greedy whatever the temperature.
    Case("top_k", {"temperature": 1.5, "top_k": 1, "max_tokens": 24}),
    # vLLM's extension: the answer runs to max_tokens past the end-of-sequence token.
    Case("ignore_eos", {"temperature": 0, "ignore_eos": True, "max_tokens": 24}, messages=SHORT_ANSWER),
    Case(
        "penalties",
        {"temperature": 0, "presence_penalty": 1.0, "frequency_penalty": 1.0, "max_tokens": 32},
    ),
    Case("logprobs", {"temperature": 0, "logprobs": True, "top_logprobs": 3, "max_tokens": 8}),
    Case(
        "json_mode",
        {"temperature": 0, "response_format": {"type": "json_object"}, "max_tokens": 32},
        messages=[{"role": "user", "content": "Give the order id 12345 as JSON."}],
    ),
    Case(
        "named_tool_call",
        {
            "temperature": 0,
            "tools": [ORDER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "order_status"}},
            "max_tokens": 32,
        },
        messages=[{"role": "user", "content": "Where is my order 12345?"}],
    ),
    Case(
        "required_tool_call",
        {"temperature": 0, "tools": [ORDER_TOOL], "tool_choice": "required", "max_tokens": 48},
        messages=[{"role": "user", "content": "Where is my order 12345?"}],
    ),
    Case(
        "required_tool_call_with_defs",
        {"temperature": 0, "tools": [ORDER_TOOL, SHIP_TOOL], "tool_choice": "required", "max_tokens": 160},
        messages=[{"role": "user", "content": "Send order 12345 to Lyon."}],
    ),
    # "auto": the model chooses; vLLM's `pythonic` parser reads its calls (the served model
    # writes one after an example of the format), in the worker as in vllm serve.
    Case(
        "auto_tool_call",
        {"temperature": 0, "tools": [ORDER_TOOL], "tool_choice": "auto", "max_tokens": 32},
        messages=PYTHONIC_EXAMPLE,
        modes=("whole", "stream", "stream_with_usage"),
    ),
    Case(
        "auto_tool_choice_answered_in_text",
        {"temperature": 0, "tools": [ORDER_TOOL], "max_tokens": 24},  # tools without a choice: "auto"
    ),
    # /v1/completions: a raw prompt, no chat template.
    Case("text_greedy", {"temperature": 0, "max_tokens": 24}, prompt=PROMPT),
    Case("text_default_max_tokens", {"temperature": 0}, prompt=PROMPT),
    Case("text_stop", {"temperature": 0, "max_tokens": 48, "stop": [","]}, prompt=PROMPT),
    Case("text_logprobs", {"temperature": 0, "logprobs": 2, "max_tokens": 8}, prompt=PROMPT),
    Case("text_n", {"temperature": 1.0, "top_p": 1.0, "seed": 7, "n": 2, "max_tokens": 16}, prompt=PROMPT),
    Case(
        "text_sampling",
        {"temperature": 0, "repetition_penalty": 1.3, "min_tokens": 20, "max_tokens": 24},
        prompt=PROMPT,
    ),
    Case(
        "repetition_and_min_tokens",
        {"temperature": 0, "repetition_penalty": 1.3, "min_tokens": 12, "max_tokens": 16},
        messages=SHORT_ANSWER,
    ),
    Case("min_p", {"temperature": 1.0, "top_p": 1.0, "seed": 99, "min_p": 0.2, "max_tokens": 24}),
    # Token ids are the served tokenizer's (resolved when the case runs).
    Case("stop_token_ids", {"temperature": 0, "max_tokens": 48, "stop_token_ids": [Tok(".")]}),
    Case(
        "logit_bias", {"temperature": 0, "max_tokens": 24, "logit_bias": {Tok(" the"): -100, Tok(","): -100}}
    ),
    Case(
        "json_schema",
        {
            "temperature": 0,
            "max_tokens": 48,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "order",
                    "schema": {
                        "type": "object",
                        "properties": {"order_id": {"type": "integer"}, "status": {"type": "string"}},
                        "required": ["order_id", "status"],
                    },
                },
            },
        },
        messages=[{"role": "user", "content": "Order 12345 has shipped. Describe it as JSON."}],
    ),
    # vLLM's output options: the stop string kept, special tokens written out (past the EOS).
    Case(
        "include_stop_str_in_output",
        {"temperature": 0, "max_tokens": 48, "stop": " password", "include_stop_str_in_output": True},
    ),
    Case(
        "special_tokens_kept",
        {
            "temperature": 0,
            "ignore_eos": True,
            "max_tokens": 24,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        },
        messages=SHORT_ANSWER,
    ),
    Case("bad_words", {"temperature": 0, "max_tokens": 24, "bad_words": [" password", " reset"]}),
    Case(
        "allowed_token_ids",
        {
            "temperature": 0,
            "max_tokens": 6,
            "allowed_token_ids": [Tok("Yes"), Tok(" yes"), Tok("."), Tok(" no")],
        },
        messages=SHORT_ANSWER,
    ),
    # vLLM's structured outputs, beside the response format.
    Case(
        "structured_regex",
        {"temperature": 0, "max_tokens": 16, "structured_outputs": {"regex": "[0-9]{5}"}},
        messages=[{"role": "user", "content": "What is the order number in: order 12345 shipped."}],
    ),
    Case(
        "structured_choice",
        {
            "temperature": 0,
            "max_tokens": 8,
            "structured_outputs": {"choice": ["shipped", "lost", "delivered"]},
        },
        messages=[{"role": "user", "content": "My parcel arrived today. Is it shipped, lost or delivered?"}],
    ),
    Case(
        "structured_grammar",
        {
            "temperature": 0,
            "max_tokens": 16,
            "structured_outputs": {"grammar": 'root ::= ("yes" | "no") "."'},
        },
        messages=SHORT_ANSWER,
    ),
    Case(
        "structured_json",
        {
            "temperature": 0,
            "max_tokens": 32,
            "structured_outputs": {
                "json": {
                    "type": "object",
                    "properties": {"order_id": {"type": "integer"}},
                    "required": ["order_id"],
                }
            },
        },
        messages=[{"role": "user", "content": "Give the order id 12345 as JSON."}],
    ),
    Case(
        "text_structured_choice",
        {"temperature": 0, "max_tokens": 8, "structured_outputs": {"choice": [" shipped", " lost"]}},
        prompt=PROMPT,
    ),
    # Parameters vLLM does not know are ignored by both.
    Case(
        "unknown_parameters", {"temperature": 0, "max_tokens": 16, "surprise": True, "metadata": {"a": "b"}}
    ),
]


class PeerRefused(RuntimeError):
    """vllm serve did not answer the request: the case itself is wrong."""


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    headers: dict[str, str]


@pytest.fixture(scope="module")
def endpoints(vllm_serve, vllm_stack) -> tuple[Endpoint, Endpoint]:
    key = vllm_stack.create_api_key("victor")
    vllm_serve.wait_ready()
    return (
        Endpoint(vllm_stack.base_url, {"Authorization": f"Bearer {key}"}),
        Endpoint(vllm_serve.base_url, {}),
    )


def _request(case: Case, mode: str) -> tuple[str, dict[str, Any]]:
    """The endpoint and the body."""
    sampling = _token_ids(case.body)
    if case.prompt is not None:
        path, body = "/v1/completions", {"model": "stable", "prompt": case.prompt, **sampling}
    else:
        path, body = "/v1/chat/completions", {"model": "stable", "messages": case.messages, **sampling}
    if mode != "whole":
        body["stream"] = True
    if mode == "stream_with_usage":
        body["stream_options"] = {"include_usage": True}
    return path, body


def _view(endpoint: Endpoint, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    url = f"{endpoint.base_url}{path}"
    response = httpx.post(url, json=body, headers=endpoint.headers, timeout=TIMEOUT_S)
    if response.status_code != 200:
        return response.status_code, response.text
    if body.get("stream"):
        return 200, stream_view(sse_chunks(response.text))
    return 200, whole_view(response.json())


@pytest.mark.parametrize(
    ("case", "mode"),
    [
        pytest.param(case, mode, id=f"{case.id}-{mode}", marks=case.marks)
        for case in CASES
        for mode in case.modes
    ],
)
def test_the_product_answers_as_vllm_serve_does(endpoints, case: Case, mode: str):
    product, peer = endpoints
    path, body = _request(case, mode)
    peer_status, peer_view = _view(peer, path, body)
    if peer_status != 200:
        raise PeerRefused(f"vllm serve answered {peer_status}: {peer_view}")
    product_status, product_view = _view(product, path, body)
    assert product_status == 200, f"the product answered {product_status}: {product_view}"
    assert differences(product_view, peer_view) == [], (product_view, peer_view)
