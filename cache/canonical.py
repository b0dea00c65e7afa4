"""Canonical form of a chat-completions request, and the keys derived from it.

Two requests that must get the same answer map to the same canonical form; any difference
that can change the answer (tenant, model, earlier turns, sampling parameters) changes it.

    exact_key    = H(tenant, model, every message, every answer-changing parameter)
    context_key  = H(tenant, model, every message but the final user one, the parameters)
    query        = the final user message's text (what the semantic tier embeds)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

# Temperatures under this sample greedily, as temperature 0 does (engine/sampling_params.GREEDY_BELOW;
# cache/ may not import the engine, and a test keeps the two equal).
GREEDY_BELOW = 1e-5
# Bumped when JSON mode's or a schema's decoding changes what it answers: a cached answer of an
# earlier grammar is then a miss (found by QA: an invalid answer cached before a fix was served after it).
FORMAT_GRAMMAR_VERSION = 2
# Roles the model reads alike: a developer message reaches the engine as a system one.
_ROLE_ALIASES = {"developer": "system"}
# Keys that never change the answer: transport and bookkeeping only.
_IGNORED = frozenset({"stream", "stream_options", "user", "metadata", "store", "service_tier"})
# Values that mean the same as leaving the field out (the engine's or the service's defaults):
# dropping them makes "absent" and "explicit default" one key. Tools turned off by a "none" choice
# never reach the model, so an empty list and a "none" choice are absent (and tools beside it);
# top_k 0 and -1 both turn top-k off; the engine's temperature is 1 (that request is cached only
# with a seed).
_DEFAULTS: dict[str, tuple[object, ...]] = {
    "n": (1,),
    "temperature": (1.0,),
    "top_p": (1.0,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "repetition_penalty": (1.0,),
    "min_tokens": (0,),
    "ignore_eos": (False,),
    "logprobs": (False,),
    "top_k": (-1, 0),
    "stop": ([],),
    "stop_token_ids": ([],),
    "logit_bias": ({},),
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none", "auto"),  # ("auto" is the choice tools have when none is sent: found by QA)
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (True,),
    "modalities": (["text"],),
}


@dataclass(slots=True, frozen=True)
class CanonicalRequest:
    exact_key: str  # hex, identifies the whole request inside the tenant
    context_key: str  # hex, the semantic namespace inside the tenant
    query: str | None  # final user message text; None: no semantic tier for this request
    deterministic: bool  # temperature 0 or a seed: the same request gets the same answer


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep only the text (a refusal's too), in order
        return "".join(p.get("text") or p.get("refusal") or "" for p in content if isinstance(p, dict))
    return str(content)


def _message(m: dict) -> dict:
    role = m.get("role")
    content = m.get("content")
    # (the model reads an assistant turn's refusal as its text when it has no content: ChatMessage.text)
    out = {"role": _ROLE_ALIASES.get(role, role), "content": _text(m.get("refusal") if content is None else content)}
    for k in ("name", "tool_calls", "tool_call_id", "function_call"):
        if m.get(k) is not None:
            out[k] = m[k]
    return out


def _params(body: dict) -> dict:
    p: dict[str, object] = {}
    # tools whose choice is "none" never reach the model (the service accepts them only so): absent
    unread = {k for k, choice in (("tools", "tool_choice"), ("functions", "function_call")) if body.get(choice) == "none"}
    if "tools" in unread or not body.get("tools"):
        unread.add("parallel_tool_calls")  # (it changes only the calls of tools that may be called)
    for k, v in body.items():
        if k in _IGNORED or k in unread or k in ("messages", "model") or v is None:
            continue
        if k == "max_completion_tokens":
            k = "max_tokens"  # same meaning, one name
        if k == "stop" and isinstance(v, str):
            v = [v]
        if k in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            v = float(v)
        if k == "temperature" and v < GREEDY_BELOW:
            v = 0.0  # greedy either way: one answer, one key
        if k == "seed" and isinstance(v, int) and not isinstance(v, bool):
            v %= 2**64  # -1 and 2**64 - 1 are one seed to the engine: one key (found by QA)
        if k in _DEFAULTS and any(type(v) is type(d) and v == d for d in _DEFAULTS[k]):
            continue
        if k == "tools":
            v = [FORMAT_GRAMMAR_VERSION, v]  # (calls are decoded under a grammar made of them)
        if k == "response_format":
            # as written: a schema's property order is the answer's (the key's sorted JSON lost it:
            # found by QA), and the grammars' version, so answers of an older grammar are not served
            v = [FORMAT_GRAMMAR_VERSION, json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)]
        p[k] = v
    if p.get("temperature") == 0.0:
        p.pop("seed", None)  # greedy: the seed changes nothing, one key (found by QA: four entries of one answer)
    return p


def _hash(obj: object) -> str:
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()


def is_deterministic(body: dict) -> bool:
    """A greedy temperature (explicit, below ``GREEDY_BELOW``) or a seed: the same request gets
    the same answer. Only such requests are cached."""
    t = body.get("temperature")
    return (t is not None and float(t) < GREEDY_BELOW) or body.get("seed") is not None


def _by_name(messages: list[dict]) -> None:
    """Tool call ids are never shown to the model (a result is shown with the name of the call it
    answers, and its arguments when the turn called that function more than once:
    ``gateway.tool_calls``): each is keyed by what is shown, so one conversation with other ids
    is one key (found by QA: it was a miss), and results swapped between two calls of one
    function are two (found by the re-check)."""
    names: dict[object, object] = {}
    for m in messages:
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            kept = []
            called = [c["function"].get("name") for c in calls
                      if isinstance(c, dict) and isinstance(c.get("function"), dict)]
            for call in calls:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    name = call["function"].get("name")
                    names[call.get("id")] = [name, call["function"].get("arguments")] if called.count(name) > 1 else name
                    call = {k: v for k, v in call.items() if k != "id"}
                kept.append(call)
            m["tool_calls"] = kept
        if "tool_call_id" in m:
            m["tool_call_id"] = names.get(m["tool_call_id"], m["tool_call_id"])


def canonicalize(namespace: str, body: dict) -> CanonicalRequest:
    """Build the keys of ``body`` inside tenant ``namespace``. Pure and cheap (no I/O)."""
    messages = [_message(m) for m in body.get("messages") or []]
    if any("tool_calls" in m for m in messages):
        _by_name(messages)
    params = _params(body)
    model = body.get("model")
    exact_key = _hash(["exact", namespace, model, messages, params])
    query: str | None = None
    callable_tools = "tools" in params or "functions" in params  # (kept: their choice calls them)
    if messages and messages[-1]["role"] == "user" and len(messages[-1]) == 2 and not callable_tools:
        # (tools that may be called: exact hits only, a paraphrase may need other arguments)
        query = messages[-1]["content"]
    context_key = _hash(["ctx", namespace, model, messages[:-1], params])
    return CanonicalRequest(exact_key, context_key, query or None, is_deterministic(body))
