"""Parsing a chat completion request with the protocol's models: vLLM's parameters reach the
engine's SamplingParams with vLLM's meaning, and what vLLM refuses is a 400 naming the parameter."""

from __future__ import annotations

import pytest
from django.test import override_settings
from jsonschema.validators import validator_for

from api.errors import ApiError, chat_request_parse, text_completion_request_parse
from api.openai_requests import NO_EFFECT, ChatCompletionRequest, CompletionRequest
from api.openai_shapes import ChoiceOutcome, completion_object, required_tool_calls
from scheduler.generation import SamplingParams, StructuredOutput, TokenLogprob, TopLogprob, Usage

HELLO = {"model": "stable", "messages": [{"role": "user", "content": "Where is my order?"}]}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "order_status",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
REFUND = {"type": "function", "function": {"name": "refund"}}


def _refusal(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat_request_parse(body)
    assert caught.value.status == 400
    return caught.value


def test_every_engine_parameter_reaches_the_sampling_params():
    request = chat_request_parse(
        HELLO
        | {
            "max_completion_tokens": 40,
            "max_tokens": 99,  # max_completion_tokens wins, as in vLLM
            "temperature": 0.3,
            "top_p": 0.9,
            "stop": "\n\n",
            "seed": 42,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.2,
            "top_k": 20,
            "min_p": 0.05,
            "min_tokens": 4,
            "ignore_eos": True,
            "stop_token_ids": [2, 7],
            "logprobs": True,
            "top_logprobs": 3,
            "logit_bias": {"17": -100},
            "response_format": {"type": "json_object"},
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "bad_words": ["refund"],
            "allowed_token_ids": [5, 6, 7],
        }
    )
    assert request.sampling_params() == SamplingParams(
        max_tokens=40,
        temperature=0.3,
        top_p=0.9,
        stop=("\n\n",),
        seed=42,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        top_k=20,
        min_p=0.05,
        min_tokens=4,
        ignore_eos=True,
        stop_token_ids=(2, 7),
        logprobs=3,
        logit_bias={17: -100.0},
        structured=StructuredOutput(json_object=True),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        bad_words=("refund",),
        allowed_token_ids=(5, 6, 7),
    )
    # The queue carries them as they were sent.
    assert SamplingParams.from_dict(request.sampling_params().to_dict()) == request.sampling_params()


@override_settings(GENERATION_MAX_TOKENS=64, GENERATION_TEMPERATURE=0, GENERATION_TOP_P=0.95)
def test_left_out_parameters_take_the_service_defaults_and_vllm_s():
    # The temperature is vLLM's and OpenAI's (1), not the chat's tuned one.
    assert chat_request_parse(HELLO).sampling_params() == SamplingParams(
        max_tokens=64, temperature=1.0, top_p=0.95
    )


def test_n_choices_need_no_temperature_as_on_vllm_serve():
    assert chat_request_parse(HELLO | {"n": 2}).choices == 2


def test_logprobs_without_top_logprobs_ask_for_the_sampled_token_only():
    assert chat_request_parse(HELLO | {"logprobs": True}).sampling_params().logprobs == 0
    assert chat_request_parse(HELLO | {"top_logprobs": None}).sampling_params().logprobs is None


def test_n_choices_are_seeded_one_apart_as_vllm_seeds_its_parallel_samples():
    request = chat_request_parse(HELLO | {"n": 3, "seed": 10, "temperature": 1})
    assert request.choices == 3
    assert [request.sampling_params(seed_offset=n).seed for n in range(3)] == [10, 11, 12]


def test_a_json_schema_response_format_constrains_the_output_to_the_schema():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    request = chat_request_parse(
        HELLO
        | {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}
    )
    assert request.sampling_params().structured == StructuredOutput(json_schema=schema)


def test_a_named_tool_choice_constrains_the_output_to_the_function_s_parameters():
    request = chat_request_parse(
        HELLO
        | {
            "tools": [LOOKUP, REFUND],
            "tool_choice": {"type": "function", "function": {"name": "order_status"}},
            "response_format": {"type": "json_object"},  # a forced tool call overrides it
        }
    )
    assert request.sampling_params().structured == StructuredOutput(
        json_schema=LOOKUP["function"]["parameters"]
    )


def test_a_required_tool_choice_constrains_the_output_to_a_list_of_calls():
    request = chat_request_parse(HELLO | {"tools": [LOOKUP, REFUND], "tool_choice": "required"})
    schema = request.sampling_params().structured.json_schema
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [branch["properties"]["name"]["enum"] for branch in schema["items"]["anyOf"]] == [
        ["order_status"],
        ["refund"],
    ]
    # A function without parameters still takes a JSON object.
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}


# What pydantic (and LangChain, through it) writes for a function taking a nested model.
ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SHIP = {
    "type": "function",
    "function": {
        "name": "ship",
        "parameters": {
            "$defs": {"Address": ADDRESS},
            "type": "object",
            "properties": {"to": {"$ref": "#/$defs/Address"}},
            "required": ["to"],
        },
    },
}


def test_a_required_tool_choice_lifts_the_tools_defs_to_the_top_where_their_refs_point():
    request = chat_request_parse(HELLO | {"tools": [LOOKUP, SHIP], "tool_choice": "required"})
    schema = request.sampling_params().structured.json_schema
    assert schema["$defs"] == {"Address": ADDRESS}
    ship = schema["items"]["anyOf"][1]["properties"]["parameters"]
    assert "$defs" not in ship and ship["properties"]["to"] == {"$ref": "#/$defs/Address"}
    # The schema the engine gets accepts a call with an address and refuses one without.
    validator = validator_for(schema)(schema)
    assert validator.is_valid([{"name": "ship", "parameters": {"to": {"city": "Lyon"}}}])
    assert not validator.is_valid([{"name": "ship", "parameters": {"to": {"street": "x"}}}])


def test_two_tools_defining_one_name_differently_are_refused_as_vllm_refuses_them():
    other = {
        "type": "function",
        "function": {"name": "bill", "parameters": {**SHIP["function"]["parameters"]}},
    }
    other["function"]["parameters"]["$defs"] = {"Address": {"type": "string"}}
    refusal = _refusal(HELLO | {"tools": [SHIP, other], "tool_choice": "required"})
    assert refusal.param == "tools"
    assert refusal.message == "Tool definition 'Address' has multiple schemas, which is not supported."


@pytest.mark.parametrize(
    ("structured_outputs", "expected"),
    [
        ({"regex": "[0-9]{5}"}, StructuredOutput(regex="[0-9]{5}")),
        ({"choice": ["yes", "no"]}, StructuredOutput(choice=("yes", "no"))),
        ({"grammar": 'root ::= "yes"'}, StructuredOutput(grammar='root ::= "yes"')),
        ({"json": {"type": "integer"}}, StructuredOutput(json_schema={"type": "integer"})),
        ({"json": '{"type": "integer"}'}, StructuredOutput(json_schema={"type": "integer"})),
        ({"json_object": True}, StructuredOutput(json_object=True)),
        # An option left as it is changes nothing.
        ({"choice": ["a"], "disable_any_whitespace": False}, StructuredOutput(choice=("a",))),
    ],
)
def test_vllm_s_structured_outputs_constrain_the_answer(structured_outputs, expected):
    for parse, body in (
        (chat_request_parse, HELLO),
        (text_completion_request_parse, {"model": "stable", "prompt": "Hi"}),
    ):
        request = parse(body | {"structured_outputs": structured_outputs})
        assert request.sampling_params().structured == expected


def test_a_required_tool_choice_overrides_structured_outputs_as_in_vllm():
    request = chat_request_parse(
        HELLO | {"tools": [LOOKUP], "tool_choice": "required", "structured_outputs": {"regex": "x"}}
    )
    assert request.sampling_params().structured.json_schema["type"] == "array"


def test_tools_with_tool_choice_none_answer_in_text():
    request = chat_request_parse(HELLO | {"tools": [LOOKUP], "tool_choice": "none"})
    assert request.sampling_params().structured is None


def test_parameters_vllm_does_not_know_are_ignored():
    request = chat_request_parse(HELLO | {"user": "u-1", "metadata": {"a": "b"}, "surprise": 1})
    assert request.sampling_params() == chat_request_parse(HELLO).sampling_params()


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_every_parameter_vllm_knows_is_applied_refused_or_without_effect(kind):
    """A parameter `vllm serve` applies is never silently dropped here (vLLM's own request
    models, from the installed vllm, are the list)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmText

    ours, theirs = {"chat": (ChatCompletionRequest, VllmChat), "text": (CompletionRequest, VllmText)}[kind]
    handled = set(ours.model_fields) | set(ours.not_applied) | NO_EFFECT
    assert set(theirs.model_fields) - handled == set()


def test_parameters_without_effect_are_accepted_and_change_nothing():
    quiet = {
        "cache_salt": "s",
        "session_id": "abc",
        "request_id": "mine",
        "stream_interval": 4,
        "priority": 0,
    }
    assert chat_request_parse(HELLO | quiet).sampling_params() == chat_request_parse(HELLO).sampling_params()


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty must be in [-2, 2], got 2.5."),
        ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty must be in [-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than zero"),
        ({"top_k": -2}, "top_k", "top_k must be 0 (disable), or at least 1, got -2."),
        ({"min_p": 1.5}, "min_p", "min_p must be in [0, 1], got 1.5."),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens", "min_tokens must be less than or equal to"),
        ({"top_logprobs": 2}, "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."),
        ({"logprobs": True, "top_logprobs": 21}, "logprobs", "greater than max allowed: 20"),
        ({"n": 0}, "n", "n must be from 1 to"),
        ({"n": 2, "temperature": 0}, "n", "n must be 1 when using greedy sampling, got 2."),
        ({"seed": 2**63}, "seed", ""),
        ({"logit_bias": {"the": 5}}, "logit_bias", "logit_bias keys must be token ids"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "`stream=True`"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "the 'json_schema' field must be"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
            "response_format.json_schema.schema",
            "Invalid JSON schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type", ""),
        ({"tools": []}, "tools", "`tools` must not be an empty array."),
        ({"tool_choice": "required"}, "tool_choice", "When using `tool_choice`, `tools` must be set."),
        (
            {"tools": [LOOKUP], "tool_choice": {"type": "function", "function": {"name": "refund"}}},
            "tool_choice",
            "does not match any of the specified `tools`",
        ),
        ({"tools": [LOOKUP], "tool_choice": "sometimes"}, "tool_choice", ""),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", ""),
        ({"messages": [{"role": "user"}]}, "messages[0]", "needs a `content`"),
        ({"max_tokens": 0}, "max_tokens", ""),
        # vLLM 0.32's SamplingParams refuses a temperature over 2 (OpenAI's range).
        ({"temperature": 3}, "temperature", "temperature must be in [0, 2], got 3.0."),
        ({"temperature": -0.5}, "temperature", "temperature must be non-negative, got -0.5."),
        ({"top_p": 0}, "top_p", "top_p must be in (0, 1], got 0.0."),
        ({"stream": "maybe"}, "stream", ""),
        # vLLM extensions that would change the answer and are not applied here.
        ({"use_beam_search": True}, "use_beam_search", "not supported by this service"),
        ({"bad_words": ["ok", ""]}, "bad_words", "bad_words cannot contain an empty string."),
        ({"allowed_token_ids": []}, "allowed_token_ids", "allowed_token_ids is not None and empty!"),
        ({"structured_outputs": {}}, "structured_outputs", "You must use one kind of structured outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "only use one kind"),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
            "only use one kind",
        ),
        ({"structured_outputs": {"choice": []}}, "structured_outputs", "cannot be an empty list"),
        ({"structured_outputs": {"grammar": " "}}, "structured_outputs", "grammar cannot be an empty string"),
        ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json", "Invalid JSON schema"),
        ({"structured_outputs": {"json": "{"}}, "structured_outputs.json", "Invalid JSON schema"),
        (
            {
                "structured_outputs": {"choice": ["a"]},
                "tools": [LOOKUP],
                "tool_choice": {"type": "function", "function": {"name": "order_status"}},
            },
            "structured_outputs",
            "either use constraints for structured outputs or tools, not both.",
        ),
        (
            {"structured_outputs": {"json_object": True, "structural_tag": "{}"}},
            "structured_outputs.structural_tag",
            "not supported",
        ),
        ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs", "not supported"),
        ({"return_token_ids": True}, "return_token_ids", "not supported"),
        ({"priority": 5}, "priority", "not supported"),
        ({"vllm_xargs": {"a": 1}}, "vllm_xargs", "not supported"),
        (
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
            "not supported",
        ),
    ],
)
def test_what_vllm_refuses_is_a_400_naming_the_parameter(extra, param, message):
    refusal = _refusal(HELLO | extra)
    assert refusal.param == param
    assert message in refusal.message


def test_a_job_refuses_tools_whose_calls_a_stored_answer_cannot_give():
    with pytest.raises(ApiError) as caught:
        chat_request_parse(HELLO | {"tools": [LOOKUP]}, param_prefix="requests[0].", in_job=True)
    assert caught.value.param == "requests[0].tool_choice"


def test_a_job_s_request_param_is_prefixed_with_its_place():
    with pytest.raises(ApiError) as caught:
        chat_request_parse(HELLO | {"top_k": -5}, param_prefix="requests[3].", in_job=True)
    assert caught.value.param == "requests[3].top_k"


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": True}, {"stream": True}])
def test_a_job_refuses_what_a_stored_answer_cannot_give(extra):
    with pytest.raises(ApiError) as caught:
        chat_request_parse(HELLO | extra, param_prefix="requests[0].", in_job=True)
    assert caught.value.param == "requests[0]." + next(iter(extra))


# --- responses ----------------------------------------------------------------------------------


def _completion(request_body: dict, *outcomes: ChoiceOutcome) -> dict:
    return completion_object(
        request_id="5d0c7f0e-0000-4000-8000-000000000001",
        created=1,
        model="stable",
        choices=list(outcomes),
        usage=Usage(5, 7),
        request=chat_request_parse(request_body),
    )


def test_a_named_tool_call_answer_is_a_tool_call_with_the_text_as_its_arguments():
    body = HELLO | {
        "tools": [LOOKUP],
        "tool_choice": {"type": "function", "function": {"name": "order_status"}},
    }
    [choice] = _completion(body, ChoiceOutcome(text='{"order_id": "A1"}', finish_reason="stop"))["choices"]
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-")
    assert (call["type"], call["function"]) == (
        "function",
        {"name": "order_status", "arguments": '{"order_id": "A1"}'},
    )
    assert (choice["message"]["content"], choice["finish_reason"]) == ("", "stop")


def test_a_required_tool_call_answer_lists_every_call_and_finishes_with_tool_calls():
    body = HELLO | {"tools": [LOOKUP, REFUND], "tool_choice": "required"}
    text = (
        '[{"name": "order_status", "parameters": {"order_id": "A1"}}, {"name": "refund", "parameters": {}}]'
    )
    [choice] = _completion(body, ChoiceOutcome(text=text, finish_reason="stop"))["choices"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        ("order_status", '{"order_id": "A1"}'),
        ("refund", "{}"),
    ]
    assert choice["finish_reason"] == "tool_calls"


def test_a_text_answer_has_no_tool_calls_field_and_logprobs_in_openai_shape():
    entry = TokenLogprob(
        "Hi", -0.25, [72, 105], (TopLogprob("Hi", -0.25, [72, 105]), TopLogprob("Yo", -2.0, None))
    )
    completion = _completion(
        HELLO | {"logprobs": True, "top_logprobs": 2, "n": 2, "temperature": 0.7},
        ChoiceOutcome(text="Hi", finish_reason="stop", logprobs=[entry]),
        ChoiceOutcome(text="", finish_reason="length", logprobs=None),
    )
    first, second = completion["choices"]
    assert first["message"] == {"role": "assistant", "content": "Hi", "refusal": None}
    assert first["logprobs"] == {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.25,
                "bytes": [72, 105],
                "top_logprobs": [
                    {"token": "Hi", "logprob": -0.25, "bytes": [72, 105]},
                    {"token": "Yo", "logprob": -2.0, "bytes": None},
                ],
            }
        ]
    }
    assert (second["index"], second["logprobs"], second["finish_reason"]) == (1, {"content": []}, "length")


def test_a_chat_choice_keeps_top_logprobs_candidates_of_what_the_engine_gave():
    # The engines give the sampled token and `top_logprobs` more, as vLLM's engine; chat shows
    # the first `top_logprobs` of them, as vLLM's chat server.
    entry = TokenLogprob("Hi", -0.25, None, (TopLogprob("Hi", -0.25, None), TopLogprob("Yo", -2.0, None)))
    completion = _completion(
        HELLO | {"logprobs": True, "top_logprobs": 1},
        ChoiceOutcome(text="Hi", finish_reason="stop", logprobs=[entry]),
    )
    [token] = completion["choices"][0]["logprobs"]["content"]
    assert token["top_logprobs"] == [{"token": "Hi", "logprob": -0.25, "bytes": None}]


def test_a_tool_call_and_its_result_go_back_to_the_model_as_the_template_reads_them():
    request = chat_request_parse(
        HELLO
        | {
            "messages": [
                {"role": "user", "content": "Where is order A1?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-1",
                            "type": "function",
                            "function": {"name": "order_status", "arguments": '{"order_id": "A1"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "Shipped on Monday."},
            ]
        }
    )
    assert request.prompt_messages() == [
        {"role": "user", "content": "Where is order A1?"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "Shipped on Monday."},
    ]


def test_required_calls_give_their_arguments_re_encoded_or_as_the_model_wrote_them():
    # vLLM's whole answer re-encodes each call's parameters; its stream sends them as written.
    text = (
        '[{"name": "order_status", "parameters": {\n  "order_id": "A}1"\n}},'
        ' {"parameters": {}, "name": "refund"}]'
    )
    assert [call.function.arguments for call in required_tool_calls(text)] == ['{"order_id": "A}1"}', "{}"]
    assert [call.function.arguments for call in required_tool_calls(text, as_written=True)] == [
        '{\n  "order_id": "A}1"\n}',
        "{}",
    ]


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.security
@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"structured_outputs": {"regex": "a" * 20_000}}, "at most 16384 are accepted"),
        ({"structured_outputs": {"grammar": 'root ::= "x"' + ' | "y"' * 5000}}, "at most 16384 are accepted"),
        ({"structured_outputs": {"choice": ["option"] * 5000}}, "at most 16384 are accepted"),
        ({"structured_outputs": {"regex": "(a|b){1000000}"}}, "repetition count"),
        ({"structured_outputs": {"regex": "[0-9]{2,99999}"}}, "repetition count"),
        ({"structured_outputs": {"regex": "((a{999}){999}){999}"}}, "repetition count"),
        ({"structured_outputs": {"regex": r"(\d{50}[a-z]{2}){40}"}}, "is 2000 (counts nested"),
        (
            {"structured_outputs": {"json": {"type": "string", "pattern": "(x{100}){100}"}}},
            "repetition count",
        ),
        ({"structured_outputs": {"json": {"type": "string", "maxLength": 1_000_000}}}, "repetition count"),
        (
            {
                "structured_outputs": {
                    "json": {"type": "array", "items": {"type": "string"}, "maxItems": 99999}
                }
            },
            "repetition count",
        ),
        ({"structured_outputs": {"json": _nested(40)}}, "nests deeper than 32"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _nested(40)}}},
            "nests deeper than 32",
        ),
    ],
)
def test_a_constraint_too_costly_to_compile_on_the_shared_worker_is_refused_with_a_400(constraint, message):
    refusal = _refusal(HELLO | constraint)
    assert refusal.param == "structured_outputs"
    assert message in refusal.message


def test_ordinary_constraints_pass_the_caps():
    for constraint in (
        {"structured_outputs": {"regex": r"\d{3}-\d{4}"}},
        {"structured_outputs": {"regex": r"(\d{3}-){3}\d{4}"}},
        {
            "structured_outputs": {
                "json": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{6}$", "maxLength": 200}
            }
        },
        {"structured_outputs": {"json": _nested(10)}},
        {"structured_outputs": {"choice": ["yes", "no"]}},
    ):
        assert chat_request_parse(HELLO | constraint).sampling_params().structured is not None
