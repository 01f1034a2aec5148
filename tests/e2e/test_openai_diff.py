"""The differential tests' views (no server): a stream folds to what its whole answer says, and
only what a client would notice counts as a difference."""

from __future__ import annotations

import pytest

from tests.e2e.openai_diff import differences, sse_chunks, stream_view, whole_view


def _chunk(delta: dict | None, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
    choices = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "stable",
        "choices": [] if delta is None else choices,
    }


def _logprob(token: str, value: float) -> dict:
    return {
        "content": [{"token": token, "logprob": value, "top_logprobs": [{"token": token, "logprob": value}]}]
    }


def test_tool_call_deltas_fold_into_one_call_per_index():
    opening = {"name": "order_status", "arguments": ""}
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": opening}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"order_id": '}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"12345"}'}}]}),
        _chunk({}, "tool_calls"),
    ]  # fmt: skip
    [choice] = stream_view(chunks)["choices"]
    assert choice["tool_calls"] == [
        {"type": "function", "name": "order_status", "arguments": '{"order_id": "12345"}'}
    ]
    assert choice["finish_reasons"] == ["tool_calls"]


def test_a_streamed_answer_and_its_whole_answer_read_the_same():
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "To"}, logprobs=_logprob("To", -0.1)),
        _chunk({"content": " reset"}, "length", logprobs=_logprob(" reset", -0.25)),
        {**_chunk(None), "usage": {"prompt_tokens": 37, "completion_tokens": 2, "total_tokens": 39}},
    ]
    whole = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "stable",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "To reset", "tool_calls": []},
                "logprobs": {
                    "content": _logprob("To", -0.1)["content"] + _logprob(" reset", -0.25)["content"]
                },
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": 37,
            "completion_tokens": 2,
            "total_tokens": 39,
            "prompt_tokens_details": None,
        },
    }
    [streamed] = stream_view(chunks)["choices"]
    [answered] = whole_view(whole)["choices"]
    assert (streamed["role"], streamed["content"], streamed["logprobs"]) == (
        answered["role"],
        answered["content"],
        answered["logprobs"],
    )
    assert stream_view(chunks)["usage_chunks"] == [whole_view(whole)["usage"]]


def test_ids_timestamps_and_extensions_are_no_difference_but_text_and_logprobs_are():
    product = whole_view(
        {
            "id": "chatcmpl-product",
            "object": "chat.completion",
            "created": 1,
            "model": "stable",
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Yes."},
                    "logprobs": {"content": _logprob("Yes", -0.5)["content"]},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )
    peer = {**product}
    assert differences(product, peer) == []
    near = {**product, "choices": [{**product["choices"][0], "logprobs": _view_logprob("Yes", -0.5004)}]}
    assert differences(product, near) == []
    far = {**product, "choices": [{**product["choices"][0], "logprobs": _view_logprob("Yes", -0.6)}]}
    assert differences(product, far) == [
        ".choices[0].logprobs[0].logprob: product -0.5, vllm serve -0.6",
        ".choices[0].logprobs[0].top_logprobs[0][1]: product -0.5, vllm serve -0.6",
    ]
    other_text = {**product, "choices": [{**product["choices"][0], "content": "No."}]}
    assert differences(product, other_text) == [".choices[0].content: product 'Yes.', vllm serve 'No.'"]


def _view_logprob(token: str, value: float) -> list[dict]:
    return [{"token": token, "logprob": value, "top_logprobs": [(token, value)]}]


def test_a_stream_cut_before_done_is_refused():
    with pytest.raises(AssertionError, match=r"\[DONE\]"):
        sse_chunks('data: {"choices": []}\n\n')
