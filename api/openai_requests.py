"""The `/v1` request bodies as pydantic models: their fields, their checks, and their translation
into the engine's `SamplingParams` (`sampling_params()`). A new parameter is added here.

Names, defaults, checks and error texts follow vLLM's OpenAI server
(`vllm/entrypoints/openai/chat_completion/protocol.py` and `completion/protocol.py`), which is
what a caller of a vLLM service expects; as there, parameters not listed are ignored. Chat and
text completions share their sampling parameters, checks and `sampling_params()` through
`SamplingRequest`. `api.errors` parses bodies with these models and turns their refusals into
OpenAI's errors.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, ClassVar, Literal, Self

from django.conf import settings
from jsonschema import SchemaError
from jsonschema.validators import validator_for
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from scheduler.generation import SamplingParams, StructuredOutput, ToolParsing

# OpenAI's roles, and what the model's chat template is given for each.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOP_SEQUENCES = 4  # vLLM's VLLM_MAX_STOP_STRINGS
MAX_TOP_LOGPROBS = 20  # vLLM's max_logprobs
_INT64 = 2**63
GREEDY_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: below it, sampling is greedy
# A request naming no temperature samples as on `vllm serve` and OpenAI (the served model's
# generation config names none), not at the chat's tuned GENERATION_TEMPERATURE: `n` > 1
# then works without one.
DEFAULT_TEMPERATURE = 1.0


# vLLM's extensions that would change the answer (or what its response carries) and that this
# service does not apply, with the values that leave it unchanged: a request that sets one
# otherwise is refused, never answered as if it had not asked. (Parameters vLLM itself does not
# know are ignored, as vLLM ignores them; tests/api/test_openai_requests.py checks that every
# parameter vLLM knows is applied, refused this way, or in NO_EFFECT.)
_NOT_APPLIED: dict[str, tuple[Any, ...]] = {
    "use_beam_search": (None, False),
    "echo": (None, False),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None,),
    "truncate_prompt_tokens": (None,),
    "thinking_token_budget": (None,),
    "repetition_detection": (None,),
    "return_tokens_as_token_ids": (None, False),
    "return_token_ids": (None, False),
    "return_token_offsets": (None, False),
    "vllm_xargs": (None,),
    "watermarking": (None,),
    # `vllm serve` without priority scheduling refuses any other priority, as this service does:
    # its tiers come from the API key.
    "priority": (None, 0),
}
# Chat's own: how the conversation becomes the prompt, and what else the response would carry.
_CHAT_NOT_APPLIED: dict[str, tuple[Any, ...]] = {
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "chat_template": (None,),
    "chat_template_kwargs": (None,),
    "add_special_tokens": (None, False),
    "documents": (None,),
    "reasoning_effort": (None,),
    "mm_processor_kwargs": (None,),
    "media_io_kwargs": (None,),
    "return_prompt_text": (None, False),
}
# vLLM's parameters that change nothing of the answer or its response here, accepted with any
# value: they steer its infrastructure (disaggregated serving, prefix-cache salting, session
# routing, multimodal rendering, expert statistics), how tokens are grouped into stream chunks,
# the engine request's id (this service makes its own), beam search's length penalty (no beam
# search), and reasoning output of models that have no reasoning parser here (none has).
NO_EFFECT = frozenset(
    {
        "cache_salt",
        "kv_transfer_params",
        "ec_transfer_params",
        "session_id",
        "request_id",
        "stream_interval",
        "routed_experts_prompt_start",
        "mm_payload",
        "return_mm_kwargs",
        "truncation_side",
        "length_penalty",
        "include_reasoning",
    }
)
# A text completion's own: a prompt continued as it is written, one answer per choice.
_TEXT_NOT_APPLIED: dict[str, tuple[Any, ...]] = {
    "suffix": (None,),
    "best_of": (None, 1),
    "add_special_tokens": (None, True),
    "prompt_embeds": (None,),
}
# OpenAI's and vLLM's default for a text completion (chat completions default to the model's room).
TEXT_COMPLETION_DEFAULT_MAX_TOKENS = 16


class RequestInvalid(ValueError):
    """A request refused with the parameter at fault (vLLM's VLLMValidationError)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """A message of the conversation. An assistant's may hold the tool calls it made (its
    content then may be null), and a `tool` message the result of one. The chat template is
    given the role and the text, as vLLM gives it to a template that has no place for tool
    calls (SmolLM2's)."""

    role: Literal[tuple(ROLES)]  # type: ignore[valid-type]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise RequestInvalid(f"A `{self.role}` message needs a `content`.")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one constraint on the answer (a JSON schema, JSON at all,
    a regular expression, one of some strings, or a grammar). Its tuning of the JSON grammar
    and its structural tags are refused unless left unchanged (see `_refuse_what_is_not_applied`)."""

    model_config = ConfigDict(extra="allow")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    @property
    def kinds(self) -> list[str]:
        """The constraints it sets (vLLM needs exactly one)."""
        values = {
            "json": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "json_object": self.json_object,
        }
        return [name for name, value in values.items() if value is not None]


# `structured_outputs` options that tune vLLM's grammars or build structural tags, not applied here.
_STRUCTURED_NOT_APPLIED: dict[str, tuple[Any, ...]] = {
    "disable_any_whitespace": (None, False),
    "disable_additional_properties": (None, False),
    "whitespace_pattern": (None,),
    "structural_tag": (None,),
}


class JsonSchemaResponseFormat(BaseModel):
    name: str
    description: str | None = None
    # OpenAI's field is `schema`, which pydantic's BaseModel reserves.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(populate_by_name=True)


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None


class FunctionDefinition(BaseModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionTool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    function: NamedFunction
    type: Literal["function"] = "function"


# Caps on a structured output constraint (SamplingRequest._constraint_caps).
MAX_SCHEMA_DEPTH = 32
MAX_REPETITION = 1000
_COUNTED = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


_SCHEMA_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def _expansion(pattern: str) -> int:
    """The most a pattern's counted repetitions multiply along one nesting: `(a{10}){20}` is
    200 copies of `a` to compile, however short the text."""
    stack = [1]  # per open group: the largest expansion inside it so far
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":  # an escaped character or class (`\d`): one atom
            i += 2
            inner = 1
        elif char == "[":  # a character class: one atom, whatever it holds
            end = pattern.find("]", i + 2)
            i = len(pattern) if end == -1 else end + 1
            inner = 1
        elif char == "(":
            stack.append(1)
            i += 1
            continue
        elif char == ")" and len(stack) > 1:
            inner = stack.pop()
            i += 1
        else:
            inner = 1
            i += 1
        count = _COUNTED.match(pattern, i)
        if count is not None:
            low, high = count.groups()
            inner *= max(int(low), int(high or 0))
            i = count.end()
        stack[-1] = max(stack[-1], inner)
    while len(stack) > 1:  # unclosed groups: the compiler refuses them, count them anyway
        inner = stack.pop()
        stack[-1] = max(stack[-1], inner)
    return stack[0]


def _schema_counts(value: Any) -> list[int]:
    """A JSON schema's counted sizes: each `pattern`'s expansion and each length or item bound
    (each compiles into as many states)."""
    if isinstance(value, list):
        return [n for child in value for n in _schema_counts(child)]
    if not isinstance(value, dict):
        return []
    counts = [_expansion(value["pattern"])] if isinstance(value.get("pattern"), str) else []
    counts += [value[key] for key in _SCHEMA_BOUNDS if isinstance(value.get(key), int)]
    return counts + [n for child in value.values() for n in _schema_counts(child)]


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in a JSON value (a scalar: 0)."""
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return 1 + max((_depth(child) for child in children), default=0) if isinstance(value, dict | list) else 0


def _check_schema(schema: dict[str, Any], param: str) -> None:
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise RequestInvalid(f"Invalid JSON schema: {exc.message}", param) from None


def _object_or_empty(parameters: dict[str, Any] | None) -> dict[str, Any]:
    # Missing parameters still constrain the arguments to a JSON object (as vLLM does).
    return parameters if parameters else {"type": "object", "properties": {}}


class SamplingRequest(BaseModel):
    """What chat and text completions share: the model, how the answer is sampled, streamed and
    shaped, vLLM's sampling extensions, their checks (vLLM's texts) and the one method that
    turns them into the engine's `SamplingParams`. Fields follow OpenAI's reference, then vLLM's
    extensions; each kind adds its prompt and how it asks for logprobs."""

    model_config = ConfigDict(extra="allow")
    # vLLM's parameters this kind of request refuses unless left unchanged (see _NOT_APPLIED).
    not_applied: ClassVar[dict[str, tuple[Any, ...]]] = _NOT_APPLIED

    model: Annotated[str, Field(min_length=1)]
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    response_format: ResponseFormat | None = None
    seed: Annotated[int, Field(ge=-_INT64, lt=_INT64)] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)]
        | None
    ) = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # Their ranges are checked with vLLM's texts (`_sampling_checks`) and shown in the document.
    temperature: float | None = Field(default=None, json_schema_extra={"minimum": 0, "maximum": 2})
    top_p: float | None = Field(default=None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})
    user: str | None = None
    # vLLM's sampling parameters beyond OpenAI's
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    bad_words: list[str] = Field(default_factory=list)
    allowed_token_ids: list[int] | None = None
    structured_outputs: StructuredOutputs | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_applied(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, unchanged in cls.not_applied.items():
                if data.get(name) not in unchanged:
                    raise RequestInvalid(f"`{name}` is not supported by this service.", name)
            structured = data.get("structured_outputs")
            for name, unchanged in _STRUCTURED_NOT_APPLIED.items():
                if isinstance(structured, dict) and structured.get(name) not in unchanged:
                    param = f"structured_outputs.{name}"
                    raise RequestInvalid(f"`{param}` is not supported by this service.", param)
            options = data.get("stream_options")
            if isinstance(options, dict) and options.get("continuous_usage_stats"):
                # Token events do not carry token counts, which usage on every chunk would need.
                raise RequestInvalid(
                    "`continuous_usage_stats` is not supported by this service.",
                    "stream_options.continuous_usage_stats",
                )
        return data

    @field_validator("max_tokens", "max_completion_tokens", check_fields=False)
    @classmethod
    def _tokens_fit(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = settings.INFERENCE_MAX_MODEL_LEN
        if value is not None and value > limit:
            raise RequestInvalid(f"`{info.field_name}` must be an integer from 1 to {limit}.")
        return value

    @model_validator(mode="after")
    def _sampling_checks(self) -> Self:
        """vLLM's checks (SamplingParams._verify_args and the request's validators), its texts."""
        temperature = self.temperature
        if temperature is not None:
            if not math.isfinite(temperature):
                raise RequestInvalid(
                    f"temperature must be a finite number, got {temperature}.", "temperature"
                )
            if temperature < 0.0:
                raise RequestInvalid(f"temperature must be non-negative, got {temperature}.", "temperature")
            if temperature > 2.0:
                raise RequestInvalid(f"temperature must be in [0, 2], got {temperature}.", "temperature")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise RequestInvalid(f"top_p must be in (0, 1], got {self.top_p}.", "top_p")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and not -2.0 <= value <= 2.0:
                raise RequestInvalid(f"{name} must be in [-2, 2], got {value}.", name)
        penalty = self.repetition_penalty
        if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
            raise RequestInvalid(
                f"repetition_penalty must be a finite number greater than zero, got {penalty}.",
                "repetition_penalty",
            )
        if self.top_k is not None and self.top_k < -1:
            raise RequestInvalid(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.", "top_k")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise RequestInvalid(f"min_p must be in [0, 1], got {self.min_p}.", "min_p")
        max_tokens = self.requested_max_tokens
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise RequestInvalid(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {self.min_tokens}.",
                "min_tokens",
            )
        n = self.choices
        if not 1 <= n <= settings.API_MAX_N:
            raise RequestInvalid(f"n must be from 1 to {settings.API_MAX_N}, got {n}.", "n")
        if n > 1 and self.sampling_temperature < GREEDY_TEMPERATURE:
            raise RequestInvalid(f"n must be 1 when using greedy sampling, got {n}.", "n")
        if any(not word for word in self.bad_words):
            raise RequestInvalid(
                f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}", "bad_words"
            )
        if self.allowed_token_ids == []:
            raise RequestInvalid("allowed_token_ids is not None and empty!", "allowed_token_ids")
        for key in self.logit_bias or {}:
            if not key.lstrip("-").isdigit():
                raise RequestInvalid(f"logit_bias keys must be token ids, got {key!r}.", "logit_bias")
        # As vLLM: an empty `stream_options` ({}) asks for nothing and is let through.
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            raise RequestInvalid("Stream options can only be defined when `stream=True`.", "stream_options")
        self._logprobs_checks()
        self._structure_checks()
        self._constraint_caps()
        return self

    def _constraint_caps(self) -> None:
        """A constraint is compiled on the shared worker before the answer starts: its size, a
        JSON schema's nesting and a pattern's counted repetitions (each expands into states) are
        capped, so that none takes the engine long to compile."""
        structured = self.structured_output()
        if structured is None:
            return
        size = len(json.dumps(structured.to_dict()))
        if size > settings.API_MAX_STRUCTURED_CHARS:
            raise RequestInvalid(
                f"The structured output constraint holds {size} characters; at most "
                f"{settings.API_MAX_STRUCTURED_CHARS} are accepted.",
                "structured_outputs",
            )
        if structured.json_schema is not None and _depth(structured.json_schema) > MAX_SCHEMA_DEPTH:
            raise RequestInvalid(
                f"The JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels.", "structured_outputs"
            )
        counts = [_expansion(pattern) for pattern in (structured.regex, structured.grammar) if pattern]
        counts += _schema_counts(structured.json_schema)
        if counts and max(counts) > MAX_REPETITION:
            raise RequestInvalid(
                f"A repetition count in the constraint is {max(counts)} (counts nested in one "
                f"another multiply); at most {MAX_REPETITION} is accepted.",
                "structured_outputs",
            )

    def _logprobs_checks(self) -> None:
        top = self.logprobs_requested
        if top is not None and (top == -1 or top > MAX_TOP_LOGPROBS):
            raise RequestInvalid(
                f"Requested sample logprobs of {'all tokens' if top == -1 else top}, which is greater "
                f"than max allowed: {MAX_TOP_LOGPROBS}",
                "logprobs",
            )

    def _structure_checks(self) -> None:
        response_format = self.response_format
        if response_format is not None and response_format.type == "json_schema":
            if response_format.json_schema is None:
                raise RequestInvalid(
                    "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                    "response_format",
                )
            _check_schema(response_format.json_schema.json_schema or {}, "response_format.json_schema.schema")
        structured = self.structured_outputs
        if structured is None:
            return
        # vLLM's checks of `structured_outputs` (the request's, then StructuredOutputsParams').
        kinds = structured.kinds
        if response_format is not None and response_format.type != "text":
            kinds = [*kinds, "response_format"]  # vLLM adds the response format's constraint to them
        if len(kinds) > 1:
            raise RequestInvalid(
                "You can only use one kind of structured outputs constraint but multiple are "
                f"specified: {', '.join(kinds)}.",
                "structured_outputs",
            )
        if not kinds:
            raise RequestInvalid(
                "You must use one kind of structured outputs constraint but none are specified.",
                "structured_outputs",
            )
        if structured.choice == []:
            raise RequestInvalid(
                f"Choice '{structured.choice}' cannot be an empty list", "structured_outputs"
            )
        if structured.grammar is not None and not structured.grammar.strip():
            raise RequestInvalid("structured_outputs.grammar cannot be an empty string", "structured_outputs")
        if structured.json_ is not None:
            _check_schema(self._structured_json_schema(), "structured_outputs.json")

    def _structured_json_schema(self) -> dict[str, Any]:
        """`structured_outputs.json`, which vLLM takes as a schema or as a schema's JSON text."""
        schema = self.structured_outputs.json_ if self.structured_outputs is not None else None
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise RequestInvalid("Invalid JSON schema: not JSON.", "structured_outputs.json") from None
        if not isinstance(schema, dict):
            raise RequestInvalid("Invalid JSON schema: not an object.", "structured_outputs.json")
        return schema

    # --- what the engine is asked for -----------------------------------------------------------

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def answer_max_tokens(self) -> int:
        """The answer's token limit; each request kind (chat, text) has its own default."""
        raise NotImplementedError

    @property
    def logprobs_requested(self) -> int | None:
        """How many most likely tokens to report beside each sampled one; None: no logprobs.
        Each request kind says it in its own field shape (chat: `top_logprobs`, text: `logprobs`)."""
        raise NotImplementedError

    @property
    def sampling_temperature(self) -> float:
        return self.temperature if self.temperature is not None else DEFAULT_TEMPERATURE

    @property
    def choices(self) -> int:
        return self.n if self.n is not None else 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def structured_output(self) -> StructuredOutput | None:
        """The constraint on the answer that the response format or `structured_outputs` asks
        for (the checks let one of them at most through)."""
        response_format = self.response_format
        if response_format is not None and response_format.type == "json_object":
            return StructuredOutput(json_object=True)
        if response_format is not None and response_format.type == "json_schema":
            assert response_format.json_schema is not None  # checked above
            return StructuredOutput(json_schema=response_format.json_schema.json_schema or {})
        structured = self.structured_outputs
        if structured is None:
            return None
        if structured.json_ is not None:
            return StructuredOutput(json_schema=self._structured_json_schema())
        return StructuredOutput(
            json_object=bool(structured.json_object),
            regex=structured.regex,
            choice=None if structured.choice is None else tuple(structured.choice),
            grammar=structured.grammar,
        )

    def sampling_params(self, *, seed_offset: int = 0) -> SamplingParams:
        """What the engine applies (vLLM's `to_sampling_params`). Choice `seed_offset` of n
        samples with the seed plus its index, as vLLM's parallel sampling seeds its children."""
        return SamplingParams(
            max_tokens=self.answer_max_tokens,
            temperature=self.sampling_temperature,
            top_p=self.top_p if self.top_p is not None else settings.GENERATION_TOP_P,
            stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
            seed=None if self.seed is None else self.seed + seed_offset,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self.repetition_penalty if self.repetition_penalty is not None else 1.0,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            logprobs=self.logprobs_requested,
            # vLLM clamps each bias to [-100, 100].
            logit_bias=None
            if self.logit_bias is None
            else {int(k): min(100.0, max(-100.0, v)) for k, v in self.logit_bias.items()},
            structured=self.structured_output(),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            bad_words=tuple(self.bad_words),
            allowed_token_ids=None if self.allowed_token_ids is None else tuple(self.allowed_token_ids),
        )


class ChatCompletionRequest(SamplingRequest):
    """A chat completion request: the conversation, logprobs as a flag and a count, tools."""

    not_applied: ClassVar[dict[str, tuple[Any, ...]]] = _NOT_APPLIED | _CHAT_NOT_APPLIED

    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[ChatCompletionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = "none"
    parallel_tool_calls: bool | None = True

    @model_validator(mode="before")
    @classmethod
    def _default_tool_choice(cls, data: Any) -> Any:
        # As OpenAI and vLLM: tools without a tool_choice mean "auto".
        if isinstance(data, dict) and "tool_choice" not in data and data.get("tools"):
            return {**data, "tool_choice": "auto"}
        return data

    @field_validator("messages")
    @classmethod
    def _messages_fit(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        limit = settings.API_MAX_MESSAGES
        if not 1 <= len(messages) <= limit:
            raise RequestInvalid(f"`messages` must be a list of 1 to {limit} messages.")
        chars = sum(len(message.text) for message in messages)
        if chars > settings.API_MAX_PROMPT_CHARS:
            raise RequestInvalid(
                f"The messages hold {chars} characters; at most {settings.API_MAX_PROMPT_CHARS} are accepted."
            )
        return messages

    def _logprobs_checks(self) -> None:
        top = self.top_logprobs
        if top is None:
            return
        if top < 0 and top != -1:
            raise RequestInvalid("`top_logprobs` must be a positive value or -1.", "top_logprobs")
        if (top == -1 or top > 0) and not self.logprobs:
            raise RequestInvalid("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        if top == -1 or top > MAX_TOP_LOGPROBS:
            raise RequestInvalid(
                f"Requested sample logprobs of {'all tokens' if top == -1 else top}, which is greater "
                f"than max allowed: {MAX_TOP_LOGPROBS}",
                "logprobs",
            )

    def _structure_checks(self) -> None:
        super()._structure_checks()
        if self.tools == []:
            raise RequestInvalid(
                "`tools` must not be an empty array. "
                "Either provide at least one tool or omit the field entirely.",
                "tools",
            )
        for n, tool in enumerate(self.tools or ()):
            _check_schema(_object_or_empty(tool.function.parameters), f"tools[{n}].function.parameters")
        choice = self.tool_choice
        if choice is None or choice == "none":
            return
        if self.tools is None:
            raise RequestInvalid("When using `tool_choice`, `tools` must be set.", "tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in self._tool_schemas():
            raise RequestInvalid(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                "tool_choice",
            )
        if isinstance(choice, NamedToolChoice) and self.structured_outputs is not None:
            raise RequestInvalid(
                "You can only either use constraints for structured outputs or tools, not both.",
                "structured_outputs",
            )
        if choice == "required":
            self._required_calls_schema()  # refuses conflicting `$defs`

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def answer_max_tokens(self) -> int:
        return self.requested_max_tokens or settings.GENERATION_MAX_TOKENS

    @property
    def logprobs_requested(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def tool_choice_forced(self) -> bool:
        """The answer is a call to a tool (named or "required"), never free text."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    @property
    def tool_choice_auto(self) -> bool:
        """The model chooses between text and tool calls, which are found in its text (tools
        given without a tool_choice mean this)."""
        return self.tool_choice == "auto"

    def tool_parsing(self, parser: str) -> ToolParsing | None:
        """How the worker reads this request's answer for tool calls with `parser`, when the
        model chooses; None otherwise."""
        if not self.tool_choice_auto:
            return None
        return ToolParsing(
            parser=parser,
            tools=[tool.model_dump(exclude_none=True) for tool in self.tools or ()],
            parallel_tool_calls=self.parallel_tool_calls is not False,
        )

    def prompt_messages(self) -> list[dict[str, str]]:
        return [{"role": ROLES[message.role], "content": message.text} for message in self.messages]

    def _tool_schemas(self) -> dict[str, dict[str, Any]]:
        return {tool.function.name: _object_or_empty(tool.function.parameters) for tool in self.tools or ()}

    def structured_output(self) -> StructuredOutput | None:
        """The constraint on the answer, as vLLM derives it: a forced tool call overrides the
        response format (named: the function's parameters; "required": a list of calls)."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return StructuredOutput(json_schema=self._tool_schemas()[choice.function.name])
        if choice == "required":
            return StructuredOutput(json_schema=self._required_calls_schema())
        return super().structured_output()

    def _required_calls_schema(self) -> dict[str, Any]:
        """A "required" answer's schema, vLLM's `_get_json_schema_from_tools`: a list of
        {name, parameters}, each function's parameters one branch. Their `$defs` move to the
        top, where the `$ref`s that pydantic and LangChain write ("#/$defs/...") point; a name
        two tools define differently is refused, as vLLM refuses it."""
        branches = []
        definitions: dict[str, Any] = {}
        for name, schema in self._tool_schemas().items():
            # An object: each tool's parameters passed the schema check (`_structure_checks`).
            for definition, definition_schema in schema.get("$defs", {}).items():
                if definitions.setdefault(definition, definition_schema) != definition_schema:
                    raise RequestInvalid(
                        f"Tool definition '{definition}' has multiple schemas, which is not supported.",
                        "tools",
                    )
            parameters = {key: value for key, value in schema.items() if key != "$defs"}
            branches.append(
                {
                    "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
                    "required": ["name", "parameters"],
                }
            )
        calls: dict[str, Any] = {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "anyOf": branches},
        }
        if self.parallel_tool_calls is False:
            calls["maxItems"] = 1
        if definitions:
            calls["$defs"] = definitions
        return calls


class CompletionRequest(SamplingRequest):
    """The legacy text completion: a raw prompt the model continues, without the chat template
    (vLLM's `completion/protocol.py`). One prompt per request, as text: token ids and several
    prompts are refused with 400, as are `echo`, `suffix` and `best_of`."""

    not_applied: ClassVar[dict[str, tuple[Any, ...]]] = _NOT_APPLIED | _TEXT_NOT_APPLIED

    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description=f"{TEXT_COMPLETION_DEFAULT_MAX_TOKENS} when left out."
    )
    logprobs: int | None = Field(
        default=None,
        description="How many most likely tokens to report beside each sampled one (vLLM: at most "
        f"{MAX_TOP_LOGPROBS}); each position's `top_logprobs` holds the sampled token and these.",
    )

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_text_prompt(cls, prompt: Any) -> Any:
        if prompt is None or prompt == "":
            raise RequestInvalid("Either prompt or prompt_embeds must be provided and non-empty.")
        if isinstance(prompt, list) and prompt and all(isinstance(p, int | list) for p in prompt):
            raise RequestInvalid("Token ids are not accepted as `prompt`: send the prompt's text.")
        if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
            raise RequestInvalid("Send one prompt per request: `prompt` may be a list of one string only.")
        return prompt

    @field_validator("prompt")
    @classmethod
    def _prompt_fits(cls, prompt: str | list[str]) -> str | list[str]:
        chars = len(prompt if isinstance(prompt, str) else prompt[0])
        if chars > settings.API_MAX_PROMPT_CHARS:
            raise RequestInvalid(
                f"The prompt holds {chars} characters; at most {settings.API_MAX_PROMPT_CHARS} are accepted."
            )
        return prompt

    def _logprobs_checks(self) -> None:
        if self.logprobs is not None and self.logprobs < -1:
            raise RequestInvalid("`logprobs` must be a positive value or -1.", "logprobs")
        super()._logprobs_checks()

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def answer_max_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else TEXT_COMPLETION_DEFAULT_MAX_TOKENS

    @property
    def logprobs_requested(self) -> int | None:
        return self.logprobs


class JobCreateRequest(BaseModel):
    requests: list[ChatCompletionRequest]
