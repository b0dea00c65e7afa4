"""Tool calls: OpenAI's ``tools`` with ``tool_choice`` ``"auto"`` (the default), ``"required"`` or a
named function.

The model is shown the tools (a system message) and its answer is decoded under a JSON Schema made
from them (``engine.json_schema``), so every call names a tool that was given and its arguments
follow that tool's ``parameters``; the answer reaches the client as ``message.tool_calls`` (streamed
as OpenAI streams them: a call's id and name first, then its arguments in pieces).

    required   {"tool_calls": [{"name": "<a tool>", "arguments": {...}}, ...]}   finish "tool_calls"
    named      the named function's arguments, {...}                            finish "stop"
    auto       as "required" when the answer's first token begins with "{", else the model's
               text (``SamplingParams.json_optional``): the model decides, as it would unguided

Earlier turns' tool calls and the ``tool`` messages that answer them are rendered as plain turns
(``messages``), as the model saw its own calls, so a conversation can go on after a call.

    plan = check_tools(body)                 gateway.tool_checks: 400s for OpenAI's shape, its rules on
                                             tool turns, and what is not served
    await plan.compile(body)                 the calls' schema compiled (400 naming the tool that fails)
    messages = plan.messages(body)           the conversation as the model reads it
    fmt = ToolCallFormat(..., choice=...)    gateway.tool_answers: the answer as tool calls, whole or streamed
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from engine.json_schema import SchemaError
from gateway.errors import invalid_request, quoted_name, unsupported
from gateway.schema_thread import compile_in_turn
from gateway.schemas import ChatCompletionRequest, JsonSchemaFormat, ResponseFormat

_LITERALS = frozenset({"const", "enum", "default", "examples"})  # values, not schemas: their "$ref"s are data
_NAMED = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"})  # name -> schema


@dataclass(slots=True)
class Tool:
    name: str
    parameters: dict  # a JSON Schema of an object (``_NO_PARAMETERS`` for a function without)
    description: str | None = None

    def shown(self) -> str:
        item: dict[str, Any] = {"name": self.name}
        if self.description:
            item["description"] = self.description
        item["parameters"] = self.parameters
        return json.dumps(item, ensure_ascii=False)


@dataclass(slots=True)
class ToolPlan:
    """What a chat's tools make of it. ``choice``: "auto", "required", "named" or None (no call
    asked: the conversation only holds earlier calls and their results, rendered as turns)."""

    choice: str | None
    tools: list[Tool] = field(default_factory=list)
    parallel: bool = True
    index: int = 0  # the named tool's place in the request's ``tools`` (for errors)

    def schema(self) -> dict:
        """The answer's JSON Schema: the named tool's parameters, or the calls object."""
        if self.choice == "named":
            return self.tools[0].parameters
        defs: dict[str, Any] = {}
        alternatives = []
        for i, tool in enumerate(self.tools):
            key = f"pagegate_tool{i}"
            defs[key] = _hoisted(tool.parameters, key, defs)
            alternatives.append({"type": "object", "properties": {"name": {"const": tool.name},
                                                                  "arguments": {"$ref": f"#/$defs/{key}"}},
                                 "required": ["name", "arguments"], "additionalProperties": False})
        calls: dict[str, Any] = {"type": "array", "minItems": 1,
                                 "items": alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}}
        if not self.parallel:
            calls["maxItems"] = 1
        return {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                "additionalProperties": False, "$defs": defs}

    async def compile(self, body: ChatCompletionRequest, share: Hashable = "") -> None:
        """Compile the answer's schema on the schema thread, in the tenant's (``share``) turn, and
        hand it to ``body`` as its ``response_format`` (the engine decodes it as structured output).
        A tool whose parameters the engine cannot decode to is a 400 naming it."""
        schema = self.schema()
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        try:
            grammar = await compile_in_turn(share, text)
        except SchemaError as err:
            for i, tool in enumerate(self.tools):  # which tool: each alone (only when it failed)
                alone = json.dumps(tool.parameters, ensure_ascii=False, separators=(",", ":"))
                try:
                    await compile_in_turn(share, alone)
                except SchemaError as own:
                    raise _schema_error(own, i if self.choice != "named" else self.index, tool.name) from err
            raise _schema_error(err, None, None) from err
        try:
            fmt = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(name="tool_calls", schema=schema))
        except ValidationError as err:  # (parameters at the depth bound, nested once more among the calls)
            raise invalid_request(f"The tools' parameters nest too deep: {quoted_name(err.errors()[0]['msg'])}.",
                                  param="tools") from err
        fmt._grammar = grammar  # noqa: SLF001 - held until the request's SamplingParams take it
        fmt._optional = self.choice == "auto"  # noqa: SLF001 - the model may answer in text instead
        body.response_format = fmt

    def messages(self, body: ChatCompletionRequest) -> list[dict]:
        """The conversation as the model reads it: an earlier turn's calls as its words
        (``Calling get_weather with {"city": "Paris"}.``), their results as one user turn
        (``Result of get_weather: ...``; ``Result of get_weather with {...}: ...`` when the turn
        called it more than once), and the tools shown in a system message when a call may be
        made (appended to the system message the conversation begins with, if any). (The calls
        as the JSON the model writes made it copy that JSON as its next text answer: found by QA;
        in words, it answers.)"""
        out: list[dict] = []
        names: dict[str, str] = {}  # call id -> function name
        for m in body.messages:
            role = "system" if m.role == "developer" else m.role
            if m.role == "tool":
                result = f"Result of {names.get(m.tool_call_id, 'the function')}: {m.text()}"
                if out and out[-1].get("results"):  # the results of one turn's calls: one turn
                    out[-1]["content"] += "\n" + result
                else:
                    out.append({"role": "user", "content": result, "results": True})
                continue
            text = m.text()
            if m.role == "assistant" and m.tool_calls:
                said = []
                called = [call["function"]["name"] for call in m.tool_calls]
                for call, name in zip(m.tool_calls, called, strict=True):
                    arguments = _arguments(call["function"]["arguments"])
                    # (a function called twice in the turn: its results told apart by their arguments)
                    names[call["id"]] = f"{name} with {arguments}" if called.count(name) > 1 else name
                    said.append(f"Calling {name} with {arguments}.")
                text = " ".join([text, *said] if text else said)
            out.append({"role": role, "content": text})
        for turn in out:
            turn.pop("results", None)
        if self.choice is not None:
            shown = self._instructions()
            if out and out[0]["role"] == "system":
                out[0]["content"] += "\n\n" + shown
            else:
                out.insert(0, {"role": "system", "content": shown})
        return out

    def _instructions(self) -> str:
        lines = ["You can call these functions (each as JSON: its name, what it does, and the JSON Schema of "
                 "its arguments):"]
        lines += [t.shown() for t in self.tools]
        form = ('{"tool_calls": [{"name": <a function\'s name>, "arguments": <its arguments>}]}')
        if self.choice == "named":
            lines.append(f"Call {self.tools[0].name}: answer with its arguments as a JSON object.")
        elif self.choice == "required":
            lines.append(f"Answer with the calls to make, as JSON: {form}.")
        else:
            lines.append(f"If calling them answers the user, answer only with the calls, as JSON: {form}. "
                         "Otherwise answer in plain text.")
        return "\n".join(lines)


def _arguments(text: str) -> str:
    """An earlier call's arguments (a JSON string) as the model is shown them: written again as
    JSON (one line) when they parse, else as sent (and as sent when they hold a ``\\ud800``
    escape, which parsed is a lone surrogate the tokenizer cannot take: found by QA, a 500)."""
    try:
        shown = json.dumps(json.loads(text), ensure_ascii=False)
        shown.encode()
    except (ValueError, RecursionError):  # (UnicodeEncodeError is a ValueError)
        return text
    return shown


def _schema_error(err: SchemaError, index: int | None, name: str | None):  # noqa: ANN202 - ApiError
    if index is None:
        message = f"The tools cannot be called together: {quoted_name(str(err))}."
        return unsupported("tools", message) if err.unsupported else invalid_request(message, param="tools")
    param = f"tools[{index}].function.parameters"
    message = f"Invalid parameters for function '{name}': {quoted_name(str(err))}."
    return unsupported(param, message) if err.unsupported else invalid_request(message, param=param)


def _hoisted(schema: object, key: str, defs: dict, *, root: bool = True) -> object:
    """``schema`` (one tool's parameters) placed at ``#/$defs/<key>`` of the calls' schema: the
    definitions at its root moved beside it under names of its own, and its references rewritten
    to reach them (``#`` is the parameters themselves). Read as a schema, keyword by keyword
    (found by QA: a property named ``default`` or ``definitions`` was taken for the keyword):
    the names under ``properties`` and the like are names, the values of ``const``, ``enum``,
    ``default`` and ``examples`` are data, and definitions below the root stay where they are
    (a ``#/$defs/A`` inside them still means the root's ``A``). Other references stay (the
    compiler names them)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for word, value in schema.items():
        if word in ("$defs", "definitions") and root and isinstance(value, dict):
            tag = "d" if word == "$defs" else "D"
            for name, sub in value.items():
                defs[f"{key}.{tag}.{name}"] = _hoisted(sub, key, defs, root=False)
        elif word == "$ref" and isinstance(value, str):
            out[word] = _moved(value, key)
        elif word in _LITERALS:
            out[word] = value
        elif word in _NAMED and isinstance(value, dict):
            out[word] = {name: _hoisted(sub, key, defs, root=False) for name, sub in value.items()}
        elif isinstance(value, dict):  # (one schema: items, additionalProperties, not, ...)
            out[word] = _hoisted(value, key, defs, root=False)
        elif isinstance(value, list):  # (schemas: anyOf, prefixItems, ...; names and types are kept)
            out[word] = [_hoisted(v, key, defs, root=False) for v in value]
        else:
            out[word] = value
    return out


def _moved(ref: str, key: str) -> str:
    if ref in ("#", "#/"):
        return f"#/$defs/{key}"
    for section, tag in (("#/$defs/", "d"), ("#/definitions/", "D")):
        if ref.startswith(section) and "/" not in ref[len(section):]:
            return f"#/$defs/{key}.{tag}.{ref[len(section):]}"  # (its escapes kept: the compiler reads them)
    return ref

