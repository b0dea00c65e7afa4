"""OpenAI request and response bodies (pydantic v2).

Requests: unknown fields are ignored (as OpenAI does); a field of the wrong type or out of range
fails validation and becomes a 400 ``invalid_request_error`` naming the field (see
``gateway.app``). Numbers are strict: a string where a number belongs is refused, an integer
where a float belongs is fine. Responses mirror the OpenAI objects the official clients parse.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from engine.sampling_params import MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES, MAX_LOGPROBS

Float = StrictFloat  # accepts JSON integers too; "0.5" (a string) and booleans are refused
_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode_text(value: str) -> str:
    """JSON may carry a lone UTF-16 surrogate (``"\\ud800"``): not text the tokenizer, the cache or
    a UTF-8 response can hold."""
    if not value.isascii() and _SURROGATE.search(value):
        raise ValueError("must be valid Unicode text (it holds a lone UTF-16 surrogate)")
    return value


Text = Annotated[StrictStr, AfterValidator(_unicode_text)]


def _null_is(default: Any) -> BeforeValidator:
    """``null`` for a field OpenAI types as nullable ("integer or null") means its default (SDKs and
    proxies send unset optionals as ``null``)."""
    return BeforeValidator(lambda value: default if value is None else value)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # NaN, Infinity, 1e400: "a finite number"


class TextPart(_Request):
    type: Literal["text"]
    text: Text


class RefusalPart(_Request):
    """An earlier assistant turn's refusal (OpenAI's ``{"type": "refusal", "refusal": ...}``, what
    its answers carry and clients send back): read as that turn's text. Only assistant turns may
    hold one (the service refuses it elsewhere, as OpenAI does)."""

    type: Literal["refusal"]
    refusal: Text


class OtherPart(_Request):
    """A part of another kind (``image_url``, ``input_audio``, ``file``, ...): refused by the service
    as ``unsupported_parameter`` (this model reads text only)."""

    type: StrictStr


def _part_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind == "refusal":
        return "part(refusal)"
    return "part(text)" if kind == "text" or not isinstance(kind, str) else "part(other)"


Part = Annotated[Annotated[TextPart, Tag("part(text)")] | Annotated[RefusalPart, Tag("part(refusal)")]
                 | Annotated[OtherPart, Tag("part(other)")], Discriminator(_part_kind)]


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]  # the last: refused
    content: Annotated[Text | Annotated[list[Part], Field(min_length=1, fail_fast=True)] | None,
                       Field(validate_default=True)] = None
    name: Text | None = None
    refusal: Text | None = None  # an assistant turn's refusal (OpenAI's answers carry it): its text when no content
    tool_calls: Any = None  # an earlier assistant turn's tool calls (checked by gateway.tool_calls)
    tool_call_id: Text | None = None  # a tool message's: the call it answers
    function_call: Any = None  # (the deprecated function calling: refused)

    @field_validator("role", mode="wrap")
    @classmethod
    def _known_role(cls, role: Any, handler: ValidatorFunctionWrapHandler) -> str:
        """An unknown role's error lists the roles served (``function`` turns are accepted by the schema
        only to be refused by the service with their own message)."""
        try:
            return handler(role)
        except ValidationError:
            raise PydanticCustomError(
                "literal_error", "Input should be 'system', 'developer', 'user', 'assistant' or 'tool'") from None

    @field_validator("content")
    @classmethod
    def _content_given(cls, content: Any, info: ValidationInfo) -> Any:
        """Only an assistant turn may omit it (a tool turn's is checked by ``gateway.tool_calls``): a missing
        ``messages[i].content``, as OpenAI names it."""
        role = info.data.get("role")
        if content is None and role is not None and role not in ("assistant", "tool", "function"):
            raise PydanticCustomError("missing", "a {role} message needs its content", {"role": role})
        return content

    def text(self) -> str:
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, TextPart) else part.refusal
                       for part in self.content if isinstance(part, TextPart | RefusalPart))


class StreamOptions(_Request):
    include_usage: StrictBool = False
    continuous_usage_stats: Any = None  # vLLM's usage in every chunk: refused when true


MAX_SCHEMA_JSON_DEPTH = 160  # arrays and objects inside a schema, annotations' too


def json_depth(value: object) -> int:
    """How deep arrays and objects nest in ``value`` (iteratively: no recursion to run out of)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _shallow_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """A schema nested past ``MAX_SCHEMA_JSON_DEPTH`` (in annotations too, which the compiler reads
    past) is refused here: dumping it for the cache key raised (found by QA: a 500)."""
    if schema is not None and json_depth(schema) > MAX_SCHEMA_JSON_DEPTH:
        raise PydanticCustomError("too_deep", "the schema nests arrays and objects more than {depth} deep",
                                  {"depth": MAX_SCHEMA_JSON_DEPTH})
    return schema


class JsonSchemaFormat(_Request):
    """``response_format.json_schema``: OpenAI's structured outputs (``strict`` is taken: the
    answer always follows the schema here)."""

    name: StrictStr
    schema_: Annotated[dict[str, Any] | None, AfterValidator(_shallow_schema)] = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class ResponseFormat(_Request):
    type: StrictStr  # "text", "json_object" (JSON mode) or "json_schema" (checked by the service)
    json_schema: JsonSchemaFormat | None = None
    # the schema's compiled grammar once ``check_schema`` has it, held until the request's
    # SamplingParams take it (``engine.json_schema.compile_schema`` finds a held grammar again)
    _grammar: Any = PrivateAttr(default=None)
    _optional: bool = PrivateAttr(default=False)  # held only by an answer begun with "{" (tool_choice "auto")

    @property
    def json_object(self) -> bool:
        return self.type == "json_object"

    def schema_text(self) -> str | None:
        """The schema of a ``json_schema`` format as the engine takes it (compact JSON, its keys in
        their order: properties are written in it); one with no schema takes any object."""
        if self.type != "json_schema" or self.json_schema is None:
            return None
        schema = self.json_schema.schema_
        return json.dumps({"type": "object"} if schema is None else schema, ensure_ascii=False, separators=(",", ":"))


def _non_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


StopText = Annotated[Text, AfterValidator(_non_empty)]  # "" would stop before anything: refused before the quota


_TOKEN_ID = re.compile(r"[0-9]{1,18}")  # (longer is no token id of any model, and int() of 4,300+ digits fails)
MAX_PROMPTS = 64  # prompts in one /v1/completions request (each is an engine request)


def _logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    """OpenAI's ``logit_bias``: token ids (as JSON object keys) to numbers in [-100, 100], at most
    ``MAX_LOGIT_BIAS_ENTRIES``; returned with canonical keys and float values (``{"01": 5}`` is
    ``{"1": 5.0}``: one meaning, one cache key), None when empty. The vocabulary is checked by the
    service."""
    if not value:
        return None
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"may bias at most {MAX_LOGIT_BIAS_ENTRIES} tokens (got {len(value)})")
    out: dict[str, float] = {}
    for key, bias in value.items():
        if not _TOKEN_ID.fullmatch(key):
            shown = key if len(key) <= 40 else key[:40] + "..."
            raise ValueError(f"invalid key {shown!r}: keys are token ids (non-negative integers)")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise ValueError(f"the bias of token {key} is {bias!r}; it must be between {-MAX_LOGIT_BIAS:g} "
                             f"and {MAX_LOGIT_BIAS:g}")
        out[str(int(key))] = float(bias)
    return out


class _Sampling(_Request):
    """Fields shared by chat and text completions (OpenAI + the vLLM extras ``extra_body`` sends)."""

    model: Text
    temperature: Annotated[Float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[Float | None, Field(gt=0, le=1)] = None
    max_tokens: Annotated[StrictInt | None, Field(ge=1)] = None
    stop: StopText | Annotated[list[StopText], Field(max_length=16, fail_fast=True)] | None = None
    seed: Annotated[StrictInt | None, Field(ge=-(2**63), le=2**64 - 1)] = None
    n: Annotated[StrictInt, _null_is(1), Field(ge=1, le=16)] = 1
    stream: Annotated[StrictBool, _null_is(False)] = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    presence_penalty: Annotated[Float | None, Field(ge=-2, le=2)] = None  # OpenAI's, over the output
    frequency_penalty: Annotated[Float | None, Field(ge=-2, le=2)] = None  # OpenAI's, over the output
    # vLLM extras
    top_k: Annotated[StrictInt | None, Field(ge=-1)] = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    ignore_eos: StrictBool = False
    repetition_penalty: Annotated[Float | None, Field(gt=0, le=10)] = None
    stop_token_ids: Annotated[list[StrictInt] | None, Field(max_length=256, fail_fast=True)] = None
    logit_bias: Annotated[dict[StrictStr, Float] | None, AfterValidator(_logit_bias)] = None  # token id -> bias
    prompt_logprobs: Annotated[StrictInt | None, Field(ge=0, le=MAX_LOGPROBS)] = None  # vLLM's; not streamed
    # vLLM extras this engine does not honour: read only so that the service refuses them when set
    # (``gateway.request_checks.VLLM_UNHONOURED``) instead of ignoring them as unknown fields
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    structured_outputs: Any = None
    min_p: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    include_stop_str_in_output: Any = None
    truncate_prompt_tokens: Any = None
    bad_words: Any = None
    allowed_token_ids: Any = None
    skip_special_tokens: Any = None
    spaces_between_special_tokens: Any = None
    detokenize: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_ids: Any = None
    logits_processors: Any = None
    priority: Any = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    # JSON objects a body may hold (messages, content parts, tools, ...), counted before validation
    # (``gateway.deps.read_and_admit``; found by QA: 250,000 content parts in a 7.8 MB body held the
    # event loop 1.2 s in validation alone, 100,000 messages 0.4 s)
    max_json_objects: ClassVar[int] = 16_384
    messages: Annotated[list[ChatMessage], Field(min_length=1, fail_fast=True)]
    max_completion_tokens: Annotated[StrictInt | None, Field(ge=1)] = None
    response_format: ResponseFormat | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt | None, Field(ge=0, le=MAX_LOGPROBS)] = None  # needs logprobs: true
    tools: Annotated[list[dict] | None, Field(fail_fast=True)] = None  # checked by gateway.tool_checks
    tool_choice: Any = None  # "none", "auto", "required" or a named function (gateway.tool_checks)
    functions: Annotated[list[dict] | None, Field(fail_fast=True)] = None  # the deprecated tools: only turned off
    function_call: Any = None
    modalities: Annotated[list[StrictStr] | None, Field(fail_fast=True)] = None  # only ["text"]
    audio: dict[str, Any] | None = None  # refused
    reasoning_effort: Any = None  # refused: this model does not reason (OpenAI refuses it for such models)
    prediction: Any = None  # predicted outputs: refused
    web_search_options: Any = None  # refused
    # OpenAI's bookkeeping fields: nothing to do here, but checked as OpenAI checks them (a QA find:
    # "store": "yes" and "metadata": [1] were taken silently)
    store: StrictBool | None = None
    parallel_tool_calls: StrictBool | None = None
    metadata: Annotated[dict[Annotated[str, StringConstraints(max_length=64)],
                             Annotated[StrictStr, StringConstraints(max_length=512)]] | None,
                        Field(max_length=16)] = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # vLLM's chat extras that would change the prompt or the answer: refused when set
    echo: Any = None
    continue_final_message: Any = None
    add_generation_prompt: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    documents: Any = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _prompt_kind(value: Any) -> str:
    """A completion prompt's shape, by the value and its first item (text otherwise)."""
    if not isinstance(value, list):
        return "prompt(text)"
    first = value[0] if value else None
    if isinstance(first, list):
        return "prompt(id lists)"
    return "prompt(texts)" if isinstance(first, str) else "prompt(ids)"


class CompletionRequest(_Sampling):
    # A string or token ids, or a batch of up to MAX_PROMPTS of either (choice index = prompt * n + j).
    # (more than MAX_PROMPTS is refused by the service: a length error here would read as a type error;
    # the shape is told by the first item, so an error names the item that breaks it)
    prompt: Annotated[
        Annotated[Text, Tag("prompt(text)")] | Annotated[list[StrictInt], Field(fail_fast=True), Tag("prompt(ids)")]
        | Annotated[list[Text], Field(fail_fast=True), Tag("prompt(texts)")]
        | Annotated[list[Annotated[list[StrictInt], Field(fail_fast=True)]], Field(fail_fast=True),
                    Tag("prompt(id lists)")],
        Discriminator(_prompt_kind)]
    echo: Annotated[StrictBool, _null_is(False)] = False
    max_tokens: Annotated[StrictInt | None, Field(ge=0)] = None  # 0: only with echo (the prompt scored)
    suffix: Text | None = None  # not supported: refused by the service
    logprobs: Annotated[StrictInt | None, Field(ge=0, le=MAX_LOGPROBS)] = None  # OpenAI's go to 5
    best_of: StrictInt | None = None  # only 1 (or unset) is supported
    response_format: ResponseFormat | None = None  # vLLM's completions take it too (found by QA)

    @property
    def batched(self) -> bool:
        """``prompt`` is a list of prompts (of one or more), not one prompt."""
        return isinstance(self.prompt, list) and bool(self.prompt) and not isinstance(self.prompt[0], int)

    def prompts(self) -> list[str] | list[list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p or isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else 16  # OpenAI's default


TokenIds = Annotated[list[StrictInt], Field(min_length=1, fail_fast=True)]


def _input_kind(value: Any) -> str:
    """By the list's first item: token ids (a whole number), lists of token ids (a list), text
    otherwise; so each shape's errors are that shape's."""
    first = value[0] if isinstance(value, list) and value else None
    if isinstance(first, list):
        return "input(id lists)"
    return "input(ids)" if isinstance(first, int) and not isinstance(first, bool) else "input(text)"


class EmbeddingRequest(_Request):
    model: Text
    # token ids (OpenAI's two other input shapes) are parsed so the service can refuse them by name
    input: Annotated[
        Annotated[Text | Annotated[list[Text], Field(min_length=1, max_length=2048, fail_fast=True)], Tag("input(text)")]
        | Annotated[TokenIds, Tag("input(ids)")]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=2048, fail_fast=True), Tag("input(id lists)")],
        Discriminator(_input_kind)]
    encoding_format: Literal["float", "base64"] | None = None  # None (the SDK's encoding_format=None): float
    dimensions: Annotated[StrictInt | None, Field(ge=1)] = None
    user: Text | None = None

    def token_ids(self) -> bool:
        """Whether ``input`` is token ids (one list of ints, or a list of them)."""
        return not isinstance(self.input, str) and not isinstance(self.input[0], str)

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    audio_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    """OpenAI sends it with every usage: code reading ``usage.completion_tokens_details.reasoning_tokens``
    must not meet a None. This model neither reasons apart nor speaks nor predicts: zeros."""
    reasoning_tokens: int = 0
    audio_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


_NO_COMPLETION_DETAILS = CompletionTokensDetails()


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = _NO_COMPLETION_DETAILS


# logprobs, as OpenAI shapes them (``gateway.formats`` builds them as plain dicts: a long answer has
# thousands of entries, and a model per entry cost ~7 µs):
#   chat choice / chunk choice:  {"content": [{"token", "logprob", "bytes", "top_logprobs":
#                                 [{"token", "logprob", "bytes"}, ...]}, ...], "refusal": null}
#   text completion choice:      {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
#                                 "text_offset"}
Logprobs = dict[str, Any]


class ChatResponseMessage(BaseModel):
    """As OpenAI sends it, ``refusal`` and ``annotations`` included: its OpenAPI schema requires
    ``refusal``, so clients generated from it refused a message without one (a QA find)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    annotations: list = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Logprobs | None = None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChunkDelta(BaseModel):
    """As OpenAI sends it: ``{"role": "assistant", "content": ""}`` first, then ``{"content": …}``,
    and ``{}`` with the finish reason: fields that are not set are left out, not null."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict] | None = None  # a tool call's pieces (gateway.tool_calls)

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: Logprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Logprobs | None = None
    finish_reason: str | None


class Completion(BaseModel):
    """Both the whole text completion and its stream chunks (OpenAI uses one shape)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


# vLLM's ``prompt_logprobs`` (when asked): per prompt token, None for the first, else
# {token id: {"logprob", "rank", "decoded_token"}}, the prompt's own token first
PromptLogprobs = list[dict[str, dict[str, Any]] | None]


class ScoredChatCompletion(ChatCompletion):
    prompt_logprobs: PromptLogprobs


class ScoredCompletionChoice(CompletionChoice):
    prompt_logprobs: PromptLogprobs


class ScoredCompletion(Completion):
    choices: list[ScoredCompletionChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pagegate"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage
