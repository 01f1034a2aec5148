"""What two OpenAI-compatible servers must agree on, read from their raw responses: the
differential tests send one request to the product and to `vllm serve` and compare these views.

A view keeps what a client reads (model, role, content or text, tool calls, logprobs, finish
reason, usage; for a stream the concatenated deltas, the finish reasons and the usage chunks),
for chat completions and text completions alike, and leaves
out what differs by nature (ids, timestamps, `system_fingerprint`) and vLLM's own extensions
(`stop_reason`, `token_ids`, `prompt_logprobs`...).
"""

from __future__ import annotations

import json
import math
from typing import Any

# Logprobs are floats from two runs of the same engine; batching and kernels may move the last digits.
LOGPROB_TOLERANCE = 1e-3


def _tool_calls(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Tool calls without their ids (random on both sides)."""
    return [
        {
            "type": call.get("type", "function"),
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }
        for call in calls or []
    ]


def _usage(usage: dict[str, Any] | None) -> dict[str, int] | None:
    if usage is None:
        return None
    return {name: usage[name] for name in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _logprobs(logprobs: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    if logprobs is None:
        return None
    return [
        {
            "token": entry["token"],
            "logprob": entry["logprob"],
            "top_logprobs": [(top["token"], top["logprob"]) for top in entry.get("top_logprobs") or []],
        }
        for entry in logprobs.get("content") or []
    ]


def _text_logprobs(logprobs: dict[str, Any] | None) -> dict[str, list[Any]] | None:
    """A text choice's logprobs; each position's candidates as sorted (token, logprob) pairs."""
    if logprobs is None:
        return None
    return {
        "tokens": logprobs["tokens"],
        "token_logprobs": logprobs["token_logprobs"],
        "top_logprobs": [sorted((top or {}).items()) for top in logprobs["top_logprobs"]],
        "text_offset": logprobs["text_offset"],
    }


def _whole_choice(choice: dict[str, Any]) -> dict[str, Any]:
    if "message" not in choice:  # a text completion's
        return {
            "index": choice["index"],
            "text": choice["text"],
            "logprobs": _text_logprobs(choice.get("logprobs")),
            "finish_reason": choice["finish_reason"],
        }
    return {
        "index": choice["index"],
        "role": choice["message"]["role"],
        "content": choice["message"].get("content"),
        "tool_calls": _tool_calls(choice["message"].get("tool_calls")),
        "logprobs": _logprobs(choice.get("logprobs")),
        "finish_reason": choice["finish_reason"],
    }


def whole_view(body: dict[str, Any]) -> dict[str, Any]:
    """The comparable part of a `chat.completion` or `text_completion` object."""
    return {
        "object": body["object"],
        "model": body["model"],
        "choices": [_whole_choice(choice) for choice in sorted(body["choices"], key=lambda c: c["index"])],
        "usage": _usage(body.get("usage")),
    }


def sse_chunks(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE body, in order; raises unless it ends with `data: [DONE]`."""
    payloads = [line.removeprefix("data:").strip() for line in text.splitlines() if line.startswith("data:")]
    if not payloads or payloads[-1] != "[DONE]":
        raise AssertionError(f"the stream does not end with data: [DONE]: {payloads[-3:]}")
    return [json.loads(payload) for payload in payloads[:-1]]


def _text_stream_choices(chunks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            view = choices.setdefault(choice["index"], {"text": "", "logprobs": None, "finish_reasons": []})
            view["text"] += choice.get("text") or ""
            logprobs = _text_logprobs(choice.get("logprobs"))
            if logprobs is not None:
                view["logprobs"] = view["logprobs"] or {name: [] for name in logprobs}
                for name, values in logprobs.items():
                    view["logprobs"][name] += values
            if choice.get("finish_reason") is not None:
                view["finish_reasons"].append(choice["finish_reason"])
    return choices


def stream_view(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparable part of a stream of `chat.completion.chunk` (or `text_completion`)
    objects: per choice, what the deltas add up to; and the usage chunks (choices empty) the
    stream ended with."""
    if {chunk["object"] for chunk in chunks} == {"text_completion"}:
        return {
            "objects": ["text_completion"],
            "models": sorted({chunk["model"] for chunk in chunks}),
            "choices": [
                {**view, "index": index} for index, view in sorted(_text_stream_choices(chunks).items())
            ],
            "usage_chunks": [
                _usage(chunk["usage"]) for chunk in chunks if not chunk["choices"] and chunk.get("usage")
            ],
        }
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            view = choices.setdefault(
                choice["index"],
                {"role": None, "content": "", "tool_calls": {}, "logprobs": None, "finish_reasons": []},
            )
            delta = choice.get("delta") or {}
            view["role"] = view["role"] or delta.get("role")
            view["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                merged = view["tool_calls"].setdefault(
                    call["index"], {"type": "function", "name": "", "arguments": ""}
                )
                function = call.get("function") or {}
                merged["name"] += function.get("name") or ""
                merged["arguments"] += function.get("arguments") or ""
            if choice.get("logprobs") is not None:
                view["logprobs"] = (view["logprobs"] or []) + (_logprobs(choice["logprobs"]) or [])
            if choice.get("finish_reason") is not None:
                view["finish_reasons"].append(choice["finish_reason"])
    return {
        "objects": sorted({chunk["object"] for chunk in chunks}),
        "models": sorted({chunk["model"] for chunk in chunks}),
        "choices": [
            {
                **view,
                "index": index,
                "tool_calls": [view["tool_calls"][n] for n in sorted(view["tool_calls"])],
            }
            for index, view in sorted(choices.items())
        ],
        "usage_chunks": [
            _usage(chunk["usage"]) for chunk in chunks if not chunk["choices"] and chunk.get("usage")
        ],
    }


def differences(product: Any, peer: Any, path: str = "") -> list[str]:
    """Where two views differ, one line per place; floats agree within LOGPROB_TOLERANCE."""
    if isinstance(product, dict) and isinstance(peer, dict):
        return [
            line
            for key in sorted(set(product) | set(peer), key=str)
            for line in differences(product.get(key), peer.get(key), f"{path}.{key}")
        ]
    if isinstance(product, list | tuple) and isinstance(peer, list | tuple):
        if len(product) != len(peer):
            return [
                f"{path}: {len(product)} items in the product, {len(peer)} in vllm serve:"
                f" {product!r} / {peer!r}"
            ]
        return [
            line
            for n, pair in enumerate(zip(product, peer, strict=True))
            for line in differences(*pair, f"{path}[{n}]")
        ]
    if isinstance(product, float) and isinstance(peer, float):
        if math.isclose(product, peer, abs_tol=LOGPROB_TOLERANCE):
            return []
    elif product == peer:
        return []
    return [f"{path}: product {product!r}, vllm serve {peer!r}"]
