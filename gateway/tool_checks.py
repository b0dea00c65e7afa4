"""The checks of a chat's tools, tool choice and earlier tool turns, as OpenAI makes them, and what
pagegate does not serve (the deprecated functions, other tool choice types): ``check_tools`` gives
the request's ``ToolPlan`` (``gateway.tool_calls``)."""

from __future__ import annotations

import json
import re

from engine.json_schema_link import MAX_PARALLEL
from gateway.errors import invalid_request, quoted_name, unsupported
from gateway.schemas import MAX_SCHEMA_JSON_DEPTH, ChatCompletionRequest, json_depth
from gateway.tool_calls import Tool, ToolPlan

MAX_CALLABLE_TOOLS = MAX_PARALLEL  # tools under "auto" or "required": their calls start alike, and the grammar follows so many
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
_TOOL_ROLES = frozenset({"tool", "function"})
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def check_tools(body: ChatCompletionRequest) -> ToolPlan | None:
    """The request's tools, tool choice and tool turns checked as OpenAI checks them; the plan, or
    None when the chat has nothing to do with tools."""
    if (body.tools is None and body.tool_choice is None and body.functions is None and body.function_call is None
            and not any(m.role in _TOOL_ROLES or m.tool_calls is not None or m.function_call is not None
                        for m in body.messages)):
        return None  # (every plain chat: one pass, ~0.8 µs where the checks below took ~2.2 µs)
    for i, m in enumerate(body.messages):
        if m.role == "function":
            raise unsupported(f"messages[{i}].role", "'function' messages (the deprecated function calling) are not "
                                                     "supported: use tools and 'tool' messages.")
        if m.function_call:
            raise unsupported(f"messages[{i}].function_call", "function_call (the deprecated function calling) is not "
                                                              "supported: use tools and tool_calls.")
    turns = _check_turns(body)
    if body.functions and body.function_call != "none":
        raise unsupported("functions", "The deprecated functions are served only with function_call 'none': "
                                       "use tools and tool_choice.")
    tools = _check_tools(body.tools or [])
    for i, function in enumerate(body.functions or []):
        _check_function_name(function, f"functions[{i}].name")
    _check_choice_type("function_call", body.function_call, ("none", "auto"))
    if body.function_call not in (None, "none"):
        raise unsupported("function_call", "The deprecated function_call is not supported: use tools and tool_choice.")
    choice = body.tool_choice
    _check_choice_type("tool_choice", choice, ("none", "auto", "required"))
    if choice is not None and choice != "none" and not tools:
        raise invalid_request("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                              "specified.", param="tool_choice")
    if not tools or choice == "none":
        return ToolPlan(None) if turns else None
    for field_name, value in (("logprobs", body.logprobs), ("prompt_logprobs", body.prompt_logprobs)):
        if value not in (None, False):  # (the calls are shown, not the text they were read from)
            raise unsupported(field_name, f"{field_name} are not available with tool calls.")
    if body.response_format is not None and body.response_format.type != "text":
        raise invalid_request("Send one of 'response_format' and a tool_choice that calls a tool.",
                              param="response_format")
    parallel = body.parallel_tool_calls is not False
    if choice != "auto" and choice is not None and (body.stop or body.stop_token_ids):
        # a call is certain: a stop could only cut its arguments (found by QA: a named call cut by
        # "," was a "stop", its success, with arguments that were no JSON)
        raise unsupported("stop" if body.stop else "stop_token_ids",
                          "Stop sequences are not supported when a tool call is required: they could only cut it.")
    if choice in (None, "auto", "required"):
        if len(tools) > MAX_CALLABLE_TOOLS:
            raise unsupported("tools", f"At most {MAX_CALLABLE_TOOLS} tools may be called from one request (their calls "
                                       f"start alike; this request has {len(tools)}): send fewer, or name one in "
                                       "tool_choice.")
        return ToolPlan("auto" if choice is None else choice, tools, parallel)
    name = _named(choice)
    for i, tool in enumerate(tools):
        if tool.name == name:
            return ToolPlan("named", [tool], parallel, index=i)
    raise invalid_request(f"Invalid value for 'tool_choice': no function named '{quoted_name(name)}' is in 'tools'.",
                          param="tool_choice")


def _check_choice_type(field_name: str, value: object, modes: tuple[str, ...]) -> None:
    if value is not None and not isinstance(value, str | dict):  # (found by QA: 1 was "not supported")
        raise invalid_request(f"Invalid type for '{field_name}': expected a string or an object.", param=field_name,
                              code="invalid_type")
    if isinstance(value, str) and value not in modes:  # a string that names no mode: a typo, not a feature (QA)
        listed = ", ".join(f"'{m}'" for m in modes)
        raise invalid_request(f"Invalid value for '{field_name}': '{quoted_name(value)}'. Supported values are: "
                              f"{listed}.", param=field_name)


def _named(choice: dict) -> str:
    if choice.get("type") != "function":
        raise unsupported("tool_choice.type", f"tool_choice of type '{quoted_name(str(choice.get('type')))}' is not "
                                              "supported: 'none', 'required' or {\"type\": \"function\", ...}.")
    function = choice.get("function")
    if not isinstance(function, dict):
        raise invalid_request("Missing required parameter: 'tool_choice.function'.", param="tool_choice.function",
                              code="missing_required_parameter")
    _check_function_name(function, "tool_choice.function.name")
    return function["name"]


def _check_tools(tools: list) -> list[Tool]:
    """OpenAI's shape, checked even for tools turned off (found by a re-check: ``{"type": "x"}``
    was served): a function tool with a named function whose parameters describe an object."""
    out: list[Tool] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        _unicode(tool, f"tools[{i}]")
        if tool.get("type") != "function":
            raise invalid_request(f"Invalid value: {str(tool.get('type'))[:40]!r}. Supported values are: 'function'.",
                                  param=f"tools[{i}].type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise invalid_request(f"Missing required parameter: 'tools[{i}].function'.", param=f"tools[{i}].function",
                                  code="missing_required_parameter")
        name = _check_function_name(function, f"tools[{i}].function.name")
        if not _NAME.fullmatch(name):
            raise invalid_request(f"Invalid 'tools[{i}].function.name': '{quoted_name(name)}'. It must be 1 to 64 "
                                  "letters, digits, underscores or dashes.", param=f"tools[{i}].function.name")
        if name in seen:
            raise invalid_request(f"Two tools are named '{name}'.", param=f"tools[{i}].function.name")
        seen.add(name)
        if function.get("strict") is not None and not isinstance(function["strict"], bool):
            raise invalid_request(f"Invalid type for 'tools[{i}].function.strict': expected a boolean.",
                                  param=f"tools[{i}].function.strict", code="invalid_type")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid_request(f"Invalid type for 'tools[{i}].function.description': expected a string.",
                                  param=f"tools[{i}].function.description", code="invalid_type")
        out.append(Tool(name, _parameters(function.get("parameters"), i), description))
    return out


def _parameters(parameters: object, i: int) -> dict:
    param = f"tools[{i}].function.parameters"
    if parameters is None or parameters == {}:
        return _NO_PARAMETERS  # (OpenAI: "omitting parameters defines a function with an empty parameter list")
    if not isinstance(parameters, dict):
        raise invalid_request(f"Invalid type for '{param}': expected an object (a JSON Schema).", param=param,
                              code="invalid_type")
    if parameters.get("type", "object") not in ("object", ["object"]):
        raise invalid_request(f"Invalid '{param}': the arguments must be an object (\"type\": \"object\").",
                              param=param)
    if json_depth(parameters) > MAX_SCHEMA_JSON_DEPTH:
        raise invalid_request(f"Invalid '{param}': the schema nests arrays and objects more than "
                              f"{MAX_SCHEMA_JSON_DEPTH} deep.", param=param)
    return parameters


def _unicode(value: object, param: str) -> None:
    """JSON may carry a lone UTF-16 surrogate (``"\\ud800"``), which the tokenizer cannot take (found
    by review: one in a tool's description was a 500): a 400, as in a message's text."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError as err:
        raise invalid_request(f"Invalid '{param}': it must be valid Unicode text (it holds a lone UTF-16 "
                              "surrogate).", param=param) from err


def _check_function_name(function: dict, param: str) -> str:
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"Missing required parameter: '{param}'.", param=param,
                              code="missing_required_parameter")
    return name


def _check_turns(body: ChatCompletionRequest) -> bool:
    """Earlier calls and their results, as OpenAI takes them: an assistant turn's ``tool_calls``
    of OpenAI's shape, each answered by a ``tool`` message (its ``tool_call_id``) before the next
    turn, and a ``tool`` message only after such calls. Whether the chat holds any."""
    pending: dict[str, int] = {}  # unanswered call ids -> the assistant turn that made them
    answerable: set[str] = set()  # the ids the last calls' turn made
    any_turn = False
    for i, m in enumerate(body.messages):
        if m.role == "tool":
            any_turn = True
            if not isinstance(m.tool_call_id, str) or not m.tool_call_id:
                raise invalid_request(f"Missing required parameter: 'messages[{i}].tool_call_id'.",
                                      param=f"messages[{i}].tool_call_id", code="missing_required_parameter")
            if m.content is None:
                raise invalid_request(f"Missing required parameter: 'messages[{i}].content'.",
                                      param=f"messages[{i}].content", code="missing_required_parameter")
            if not answerable:
                raise invalid_request("Invalid parameter: messages with role 'tool' must be a response to a "
                                      "preceding message with 'tool_calls'.", param=f"messages[{i}].role")
            if m.tool_call_id not in answerable:
                raise invalid_request(f"Invalid parameter: 'tool_call_id' of '{quoted_name(m.tool_call_id)}' not "
                                      "found in 'tool_calls' of previous message.",
                                      param=f"messages[{i}].tool_call_id")
            pending.pop(m.tool_call_id, None)
            continue
        _unanswered(pending)
        answerable = set()
        if m.tool_calls is None or m.tool_calls == []:  # (none: harmless, as before)
            continue
        if m.role != "assistant":
            raise invalid_request(f"Only assistant messages may hold tool_calls ('{m.role}' message).",
                                  param=f"messages[{i}].tool_calls")
        any_turn = True
        _unicode(m.tool_calls, f"messages[{i}].tool_calls")
        for call_id in _check_calls(m.tool_calls, f"messages[{i}].tool_calls"):
            pending[call_id] = i
            answerable.add(call_id)
    _unanswered(pending)
    return any_turn


def _unanswered(pending: dict[str, int]) -> None:
    if pending:
        turn = min(pending.values())
        ids = ", ".join(quoted_name(c) for c in pending)
        raise invalid_request("An assistant message with 'tool_calls' must be followed by tool messages responding "
                              f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                              f"{ids}", param=f"messages[{turn}].role")


def _check_calls(calls: object, param: str) -> list[str]:
    if not isinstance(calls, list):
        raise invalid_request(f"Invalid type for '{param}': expected an array.", param=param, code="invalid_type")
    ids = []
    for j, call in enumerate(calls):
        at = f"{param}[{j}]"
        if not isinstance(call, dict):
            raise invalid_request(f"Invalid type for '{at}': expected an object.", param=at, code="invalid_type")
        if call.get("type", "function") != "function":
            raise invalid_request(f"Invalid value: {str(call.get('type'))[:40]!r}. Supported values are: 'function'.",
                                  param=f"{at}.type")
        function = call.get("function")
        for field_name, value in (("id", call.get("id")), ("function", function)):
            if value is None:
                raise invalid_request(f"Missing required parameter: '{at}.{field_name}'.", param=f"{at}.{field_name}",
                                      code="missing_required_parameter")
        if not isinstance(call["id"], str) or not isinstance(function, dict):
            bad = "id" if not isinstance(call["id"], str) else "function"
            raise invalid_request(f"Invalid type for '{at}.{bad}'.", param=f"{at}.{bad}", code="invalid_type")
        for field_name in ("name", "arguments"):
            if not isinstance(function.get(field_name), str):
                raise invalid_request(f"Missing required parameter: '{at}.function.{field_name}' (a string).",
                                      param=f"{at}.function.{field_name}", code="missing_required_parameter")
        ids.append(call["id"])
    return ids

