"""What a chat or text completion request is checked for before it runs: the model and the key's
right to it (404 / 403), the prompt's size against the context (400), ``max_tokens``, the sampling
fields, and the OpenAI fields and vLLM extras the engine cannot honour (refused, never silently
dropped). The pipeline that calls these is ``gateway/chat_service.py``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Hashable
from typing import Any

from pydantic import ValidationError

from engine.json_schema import SchemaError
from engine.protocol import EngineClient
from engine.sampling_params import SamplingParams
from gateway.deps import Caller
from gateway.embedding_service import is_embedding_model, may_use_embedding_model
from gateway.errors import invalid_request, model_not_found, permission_denied, quoted_name, unsupported
from gateway.formats import TokenNames
from gateway.generation import context_length_exceeded, far_too_long, too_many_turns
from gateway.schema_thread import compile_in_turn
from gateway.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonSchemaFormat,
    RefusalPart,
    ResponseFormat,
    TextPart,
)
from gateway.tool_calls import ToolPlan
from gateway.tool_checks import check_tools

LONG_PROMPT_CHARS = 8_000  # prompts longer than this are tokenized on a worker thread
LONG_CHAT_MESSAGES = 64  # and chats of more messages than this (the template's rendering is per message)


def resolve_engine(caller: Caller, model: str) -> EngineClient:
    engine = caller.state.engine
    if engine is None or model != engine.model_id:
        settings = caller.state.settings  # (an alias of the embedding model is allowed as it is there)
        embedding = is_embedding_model(settings, model) and may_use_embedding_model(caller.principal, settings)
        raise model_not_found(model, "/v1/embeddings (an embedding model)" if embedding else None)
    if not caller.principal.may_use(model):
        raise permission_denied(f"This API key is not allowed to use the model `{quoted_name(model)}`.",
                                code="model_not_allowed")
    return engine


def refuse_far_too_long(engine: EngineClient, size: int, *, what: str = "messages", messages: int = 0) -> None:
    """A prompt of ``size`` characters (in ``messages`` chat messages) that can never fit the context:
    400 before the tokenizer (or the cache's embedder) spends seconds on it. Each message adds the
    chat template's special tokens (``message_tokens``), whatever it holds (found by QA: 250,000
    empty messages passed, and rendering them held the event loop for 3-9 s before the 400)."""
    limit = getattr(engine, "max_prompt_chars", None)
    if limit is not None and size > limit:
        raise far_too_long(size, engine.max_model_len, what=what)
    per_message = getattr(engine, "message_tokens", 0)
    if messages and per_message:
        context = engine.max_model_len
        at_least = messages * per_message + (size * context // limit if limit else 0)
        if at_least > context:
            raise too_many_turns(messages, per_message, at_least, context)


async def tokenize(engine: EngineClient, fn: Callable[[Any], list[int]], arg: Any, size: int, *,
                   what: str = "messages", messages: int = 0) -> list[int]:
    """``fn(arg)``'s token ids; ``size`` characters in ``messages`` chat messages. A long text, or a
    chat of many messages, is tokenized on a worker thread (the engine's tokenizer releases the GIL
    for long texts; the template's rendering holds it, but the event loop still gets its turns)."""
    refuse_far_too_long(engine, size, what=what, messages=messages)
    if size > LONG_PROMPT_CHARS or messages > LONG_CHAT_MESSAGES:
        return list(await asyncio.to_thread(fn, arg))
    return list(fn(arg))


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int, *, min_tokens: int = 0,
                       what: str = "messages", defaulted: bool = False, field: str = "max_tokens") -> int:
    """``requested`` if the context has room for it; unset: all the room left. ``min_tokens`` must
    not be more than that (vLLM refuses it too). ``defaulted``: ``requested`` is the route's default
    (text completions' 16), not the client's. ``field``: the name the client gave ``requested``
    (``max_completion_tokens`` on chat, when sent: found by QA, the message named max_tokens)."""
    room = max_model_len - prompt_tokens
    # max_tokens 0 (a prompt scored with echo) may fill the whole context (found by QA); a requested
    # completion is named in the message (found by QA)
    if room < (0 if requested == 0 else 1) or (requested is not None and requested > room):
        raise context_length_exceeded(prompt_tokens, max_model_len, requested, what=what)
    max_tokens = room if requested is None else requested
    if min_tokens > max_tokens:
        if requested is None:  # (found by QA: "more than max_tokens (110)" to a request that sent none)
            raise invalid_request(f"min_tokens ({min_tokens}) is more than the context leaves for the completion: "
                                  f"the prompt's {prompt_tokens} tokens leave {room} of the model's "
                                  f"{max_model_len}.", param="min_tokens")
        default = ", the default when none is sent" if defaulted else ""  # (a re-check: it named a max_tokens
        raise invalid_request(f"min_tokens ({min_tokens}) must not be more than {field} "  # never sent)
                              f"({max_tokens}{default}).", param="min_tokens")
    return max_tokens


def vocab_size(engine: EngineClient) -> int | None:
    """The model's vocabulary size, when the engine tells it."""
    size = getattr(engine, "vocab_size", None)  # AsyncEngine has it; a remote upstream may not
    return None if size is None else int(size)


def refuse_unsupported(body: ChatCompletionRequest | CompletionRequest, engine: EngineClient) -> None:
    """400 for token ids outside the model's vocabulary (the engine would index its logits with
    them). Every sampling field the schema accepts is honoured by the engine, none is ignored."""
    vocab = vocab_size(engine)
    if body.stop_token_ids and vocab is not None:
        for i, t in enumerate(body.stop_token_ids):  # the item, as stop[i] and prompt[i] are named (QA)
            if not 0 <= t < vocab:
                raise invalid_request(f"stop_token_ids must be token ids in [0, {vocab}).",
                                      param=f"stop_token_ids[{i}]")
    if body.logit_bias and vocab is not None:
        outside = next((k for k in body.logit_bias if int(k) >= vocab), None)
        if outside is not None:
            raise invalid_request(f"Invalid key in 'logit_bias': {outside}. Maximum value is {vocab - 1}.",
                                  param="logit_bias")


def scores_prompt(body: ChatCompletionRequest | CompletionRequest) -> bool:
    """A text completion with ``echo`` and ``logprobs``: the echoed prompt's tokens get logprobs too
    (the engine's ``prompt_logprobs``), as OpenAI's legacy API and vLLM give them."""
    return isinstance(body, CompletionRequest) and body.echo and body.logprobs is not None


def prompt_logprobs_asked(body: ChatCompletionRequest | CompletionRequest) -> int | None:
    """The most likely tokens the engine reports per prompt position: for ``echo`` with
    ``logprobs``, for vLLM's ``prompt_logprobs``, or for both (the more of the two); None: none."""
    asked = [k for k in (body.logprobs if scores_prompt(body) else None, body.prompt_logprobs) if k is not None]
    return max(asked) if asked else None


def sampling_params(body: ChatCompletionRequest | CompletionRequest, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(
            n=body.n,
            temperature=1.0 if body.temperature is None else float(body.temperature),
            top_p=1.0 if body.top_p is None else float(body.top_p),
            top_k=body.top_k or 0,
            seed=body.seed,
            max_tokens=max_tokens,
            min_tokens=min(body.min_tokens, max_tokens),
            stop=body.stop_list(),
            stop_token_ids=list(body.stop_token_ids or []),
            ignore_eos=body.ignore_eos,
            repetition_penalty=1.0 if body.repetition_penalty is None else float(body.repetition_penalty),
            presence_penalty=float(body.presence_penalty or 0.0),
            frequency_penalty=float(body.frequency_penalty or 0.0),
            logprobs=logprobs_asked(body),
            prompt_logprobs=prompt_logprobs_asked(body),
            logit_bias=None if body.logit_bias is None else {int(k): v for k, v in body.logit_bias.items()},
            json_object=body.response_format is not None and body.response_format.json_object,
            json_schema=None if body.response_format is None else body.response_format.schema_text(),
            json_optional=body.response_format is not None and body.response_format._optional,  # noqa: SLF001
        )
    except ValueError as err:
        message = str(err)
        raise invalid_request(message, param=message.split()[0]) from err


def logprobs_asked(body: ChatCompletionRequest | CompletionRequest) -> int | None:
    """How many most likely tokens to show per position (0: only the chosen one's), None: no logprobs."""
    if isinstance(body, CompletionRequest):
        return body.logprobs
    return (body.top_logprobs or 0) if body.logprobs else None


def token_names_for(body: ChatCompletionRequest | CompletionRequest, engine: EngineClient) -> TokenNames | None:
    """The engine's token names when the request asked for logprobs (the formats show them)."""
    if logprobs_asked(body) is None:
        return None
    try:
        engine.token_bytes([])  # a model without a tokenizer cannot name its tokens
    except ValueError as err:
        raise unsupported("logprobs", f"logprobs are not available: {err}.") from err
    return TokenNames.for_engine(engine)


# vLLM's extra fields this engine does not honour, each with the values that ask for nothing (a
# client sending those loses nothing): any other value is refused, never silently dropped (found
# by QA: guided_choice and min_p were ignored as unknown fields, and the answer was free text)
_GUIDED = ("Regex, choice and grammar constraints are not supported; JSON ones are (guided_json, "
           "structured_outputs.json or OpenAI's response_format).")
VLLM_UNHONOURED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("guided_json", (None,), _GUIDED),
    ("guided_regex", (None,), _GUIDED),
    ("guided_choice", (None,), _GUIDED),
    ("guided_grammar", (None,), _GUIDED),
    ("structured_outputs", (None,), _GUIDED),
    ("guided_decoding_backend", (None,), _GUIDED),
    ("guided_whitespace_pattern", (None,), _GUIDED),
    ("min_p", (None, 0, 0.0), "min_p sampling is not supported by this engine (use top_p or top_k)."),
    ("use_beam_search", (None, False), "Beam search is not supported by this engine."),
    ("length_penalty", (None, 1, 1.0), "length_penalty applies to beam search, which this engine does not do."),
    ("include_stop_str_in_output", (None, False), "include_stop_str_in_output is not supported: the stop "
                                                  "string is never part of the answer."),
    ("truncate_prompt_tokens", (None,), "truncate_prompt_tokens is not supported: send a shorter prompt."),
    ("bad_words", (None, []), "bad_words is not supported (logit_bias can ban single tokens)."),
    ("allowed_token_ids", (None,), "allowed_token_ids is not supported (logit_bias can ban or favour tokens)."),
    ("skip_special_tokens", (None, True), "Special tokens are never part of the answer's text here."),
    ("spaces_between_special_tokens", (None, True), "Special tokens are never part of the answer's text here."),
    ("detokenize", (None, True), "The answer is always text (logprobs can show its tokens)."),
    ("return_tokens_as_token_ids", (None, False), "Tokens are shown as text (logprobs' bytes give their bytes)."),
    ("return_token_ids", (None, False), "Token ids are not returned by this gateway."),
    ("logits_processors", (None, []), "Custom logits processors are not supported (logit_bias is)."),
    ("priority", (None, 0), "Request priorities are not supported: the engine shares its time between tenants."),
)
VLLM_CHAT_UNHONOURED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("echo", (None, False), "echo is not supported for chat completions (it is for /v1/completions)."),
    ("continue_final_message", (None, False), "continue_final_message is not supported by this gateway."),
    ("add_generation_prompt", (None, True), "add_generation_prompt must be true: the chat template always "
                                            "ends with the assistant's turn."),
    ("chat_template", (None,), "The model's own chat template is always used."),
    ("chat_template_kwargs", (None, {}), "The model's own chat template is always used, without arguments."),
    ("documents", (None, []), "Documents for the chat template are not supported: put them in a message."),
)


_VLLM_FIELDS = frozenset(f for f, _, _ in VLLM_UNHONOURED + VLLM_CHAT_UNHONOURED)


def _refuse_vllm_extras(body: ChatCompletionRequest | CompletionRequest) -> None:
    if body.stream_options is not None and body.stream_options.continuous_usage_stats not in (None, False):
        raise unsupported("stream_options.continuous_usage_stats",
                          "Usage in every chunk is not supported; include_usage sends it in a last chunk.")
    if body.model_fields_set.isdisjoint(_VLLM_FIELDS):  # the common case: one set operation
        return
    fields = VLLM_UNHONOURED if isinstance(body, CompletionRequest) else VLLM_UNHONOURED + VLLM_CHAT_UNHONOURED
    for field, neutral, message in fields:
        value = getattr(body, field)
        if not any(_same_value(value, n) for n in neutral):
            _check_extra_type(field, value, neutral)
            raise unsupported(field, message)


def _same_value(value: Any, neutral: Any) -> bool:
    """``value`` is the neutral value: of its type, or a number equal to a numeric one (``priority:
    0.0`` is 0; found by QA), never a boolean for a number or the other way round."""
    if value is neutral or (type(value) is type(neutral) and value == neutral):
        return True
    numbers = (int, float)
    return (type(value) in numbers and type(neutral) in numbers and value == neutral)


_KIND = {int: "a number", float: "a number", bool: "a boolean", list: "an array", dict: "an object"}


def _check_extra_type(field: str, value: Any, neutral: tuple[Any, ...]) -> None:
    """A refused extra of a type its neutral values do not have is a wrong type, not a feature
    missing (found by QA: ``min_p: "x"`` was ``unsupported_parameter``); one whose neutral value
    is only null has no type to check."""
    kinds = {type(n) for n in neutral if n is not None}
    if int in kinds:
        kinds.add(float)
    if kinds and type(value) not in kinds:
        expected = " or ".join(sorted({_KIND.get(k, k.__name__) for k in kinds}))
        raise invalid_request(f"Invalid type for '{field}': expected {expected}.", param=field, code="invalid_type")


_FORMAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_response_format(body: ChatCompletionRequest | CompletionRequest) -> None:
    """"text", "json_object" (JSON mode) and "json_schema" (structured outputs) are served. A chat
    in JSON mode must mention JSON, as OpenAI requires: told nothing of it, a model may fill its
    answer with whitespace until the token limit (OpenAI's reason; the object itself is guaranteed
    either way). A schema the engine cannot decode to is a 400 saying what and where."""
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None:
            raise invalid_request("Missing required parameter: 'response_format.json_schema'.",
                                  param="response_format.json_schema", code="missing_required_parameter")
        if not _FORMAT_NAME.fullmatch(spec.name):
            raise invalid_request(f"Invalid 'response_format.json_schema.name': '{quoted_name(spec.name)}'. It must be "
                                  "1 to 64 letters, digits, underscores or dashes.",
                                  param="response_format.json_schema.name")
        return  # (the schema itself: check_schema)
    if not fmt.json_object:
        raise invalid_request(f"Invalid value: '{quoted_name(fmt.type)}'. Supported values are: 'text', 'json_object' "
                              "and 'json_schema'.", param="response_format.type")
    if isinstance(body, ChatCompletionRequest) and not any("json" in f"{m.text()} {m.refusal or ''}".lower()
                                                           for m in body.messages):
        raise invalid_request("'messages' must contain the word 'json' in some form, to use 'response_format' of "
                              "type 'json_object'.", param="messages")


async def check_schema(body: ChatCompletionRequest | CompletionRequest, share: Hashable = "") -> None:
    """A ``json_schema`` format's schema compiled (``refuse_unhonoured`` has checked the rest): a
    400 saying what and where when the engine cannot decode to it. Off the event loop, in the
    tenant's (``share``) turn on ``schema_worker`` (the format holds the grammar until the request's
    SamplingParams take it, so their compile is a lookup)."""
    fmt = body.response_format
    if fmt is None or fmt.type != "json_schema" or fmt.json_schema is None:
        return
    try:  # (nesting is bounded before: JsonSchemaFormat's depth check, then the compiler's)
        fmt._grammar = await compile_in_turn(share, fmt.schema_text())  # noqa: SLF001 - held, see ResponseFormat
    except SchemaError as err:
        message = f"Invalid schema for response_format '{fmt.json_schema.name}': {quoted_name(str(err))}."
        if err.unsupported:
            raise unsupported("response_format.json_schema.schema", message) from err
        raise invalid_request(message, param="response_format.json_schema.schema") from err


def _take_vllm_json(body: ChatCompletionRequest | CompletionRequest) -> None:
    """vLLM's JSON constraints, ``guided_json`` (a schema, or its JSON text) and ``structured_outputs``
    with ``json`` or ``json_object: true``, are served as OpenAI's ``response_format`` of type
    ``json_schema`` (``json_object``: any object, without OpenAI's "json" word rule, as vLLM takes it);
    its regex, choice and grammar constraints stay refused (``_refuse_vllm_extras``)."""
    field, schema = None, None
    if body.guided_json is not None:
        field, schema = "guided_json", body.guided_json
    spec = body.structured_outputs
    if isinstance(spec, dict) and spec and all(v in (None, False) for k, v in spec.items() if k not in ("json", "json_object")):
        if spec.get("json") is not None:
            if field is not None:
                raise invalid_request("Send one of 'guided_json' and 'structured_outputs'.", param="structured_outputs")
            field, schema = "structured_outputs.json", spec["json"]
        elif spec.get("json_object") is True and field is None:
            field, schema = "structured_outputs.json_object", {"type": "object"}
    if field is None:
        return
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as err:
            raise invalid_request(f"'{field}' is not JSON.", param=field) from err
    if not isinstance(schema, dict):
        raise invalid_request(f"'{field}' must be a JSON Schema (an object).", param=field, code="invalid_type")
    if body.response_format is not None and body.response_format.type != "text":
        raise invalid_request(f"Send one of 'response_format' and '{field.split('.')[0]}'.", param=field)
    try:
        body.response_format = ResponseFormat(type="json_schema",
                                              json_schema=JsonSchemaFormat(name="guided_json", schema=schema))
    except ValidationError as err:  # (a schema nested past what is read)
        raise invalid_request(f"Invalid '{field}': {quoted_name(err.errors()[0]['msg'])}.", param=field) from err
    body.guided_json = body.structured_outputs = None


def refuse_unhonoured(body: ChatCompletionRequest | CompletionRequest) -> ToolPlan | None:
    """Known OpenAI fields (and vLLM extras) the engine cannot honour are refused, never silently
    dropped. A chat's tool plan (``gateway.tool_calls``), None when tools play no part."""
    if body.stream_options is not None and not body.stream:  # as OpenAI and vLLM answer it
        raise invalid_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                              param="stream_options")
    if body.prompt_logprobs is not None and body.stream:  # as vLLM answers it
        raise invalid_request("'prompt_logprobs' are not available when 'stream' is true.", param="prompt_logprobs")
    _take_vllm_json(body)
    _refuse_vllm_extras(body)
    _check_response_format(body)
    if isinstance(body, CompletionRequest):
        return None
    for i, m in enumerate(body.messages):
        if m.refusal is not None and m.role != "assistant":
            raise invalid_request(f"Only assistant messages may carry a refusal ('{m.role}' message).",
                                  param=f"messages[{i}].refusal")
        for j, part in enumerate(m.content if isinstance(m.content, list) else ()):
            if isinstance(part, RefusalPart):
                if m.role != "assistant":
                    raise invalid_request(f"Content parts of type 'refusal' are only allowed in assistant "
                                          f"messages ('{m.role}' message).", param=f"messages[{i}].content[{j}].type")
            elif not isinstance(part, TextPart):
                raise unsupported(f"messages[{i}].content[{j}].type", f"Content parts of type '{quoted_name(part.type)}' are "
                                                                      "not supported: this model reads text only.")
    plan = check_tools(body)  # (tools, tool_choice and earlier calls: gateway.tool_calls)
    if body.top_logprobs is not None and not body.logprobs:  # as OpenAI answers it
        raise invalid_request("'top_logprobs' needs 'logprobs' set to true.", param="top_logprobs")
    if body.modalities and set(body.modalities) != {"text"}:
        raise unsupported("modalities", "Only text output is supported.")
    if body.audio is not None:
        raise unsupported("audio", "Audio output is not supported.")
    for field, what in (("reasoning_effort", "Reasoning effort is not supported by this model."),
                        ("prediction", "Predicted outputs are not supported by this model."),
                        ("web_search_options", "Web search is not supported by this model.")):
        if getattr(body, field) is not None:
            raise unsupported(field, what)
    return plan
