"""The worker's reading of an answer for tool calls with vLLM's own parser (`pythonic`, the one the
differential peer runs), without an engine: what a streamed and a whole answer carry."""

from __future__ import annotations

import json

import pytest

from inference.engines.vllm import ToolCallReader
from scheduler.generation import CalledTool, ParsedAnswer, ParsedDelta, ToolParsing

ORDER_TOOL = {"type": "function", "function": {"name": "order_status", "parameters": {"type": "object"}}}


def _reader(*, parallel_tool_calls: bool = True) -> ToolCallReader:
    from vllm.parser import ParserManager

    parser_cls = ParserManager.get_parser(tool_parser_name="pythonic", enable_auto_tools=True)
    parsing = ToolParsing(parser="pythonic", tools=[ORDER_TOOL], parallel_tool_calls=parallel_tool_calls)
    return ToolCallReader(parser_cls, parsing, tokenizer=None, model_config=None, prompt_token_ids=[1, 2, 3])


def _read(reader: ToolCallReader, pieces: list[str]) -> list[ParsedDelta]:
    return [reader.delta(piece, [n], finished=n == len(pieces) - 1) for n, piece in enumerate(pieces)]


def test_a_call_streams_as_pieces_of_one_call_and_the_whole_answer_holds_it():
    reader = _reader()
    deltas = _read(reader, ["[order", "_status(order_id=", '"12345")', "]"])
    pieces = [call for delta in deltas for call in delta.tool_calls]
    assert {call.index for call in pieces} == {0}
    assert pieces[0].id is not None and pieces[0].name == "order_status"
    assert json.loads("".join(call.arguments or "" for call in pieces)) == {"order_id": "12345"}
    assert not any(delta.content for delta in deltas)  # the call's text is not content
    assert reader.answer() == ParsedAnswer(
        content=None, tool_calls=(CalledTool(name="order_status", arguments='{"order_id": "12345"}'),)
    )


def test_plain_text_streams_as_content_and_calls_no_tool():
    reader = _reader()
    deltas = _read(reader, ["Your parcel ", "is on its way."])
    assert "".join(delta.content or "" for delta in deltas) == "Your parcel is on its way."
    assert reader.answer() == ParsedAnswer(content="Your parcel is on its way.", tool_calls=())


@pytest.mark.parametrize("parallel_tool_calls", [True, False])
def test_without_parallel_tool_calls_only_the_first_call_is_kept(parallel_tool_calls):
    reader = _reader(parallel_tool_calls=parallel_tool_calls)
    deltas = _read(reader, ['[order_status(order_id="1"), ', 'order_status(order_id="2")]'])
    indexes = {call.index for delta in deltas for call in delta.tool_calls}
    calls = reader.answer().tool_calls
    assert (indexes, len(calls)) == (({0, 1}, 2) if parallel_tool_calls else ({0}, 1))
