"""Request/response builders shared by the cache tests."""

from __future__ import annotations


def chat(text: str, *, history: list[dict] | None = None, **params) -> dict:
    params.setdefault("temperature", 0)
    msgs = list(history or []) + [{"role": "user", "content": text}]
    return {"model": "smollm2-135m-instruct", "messages": msgs, **params}


def answer(text: str, finish: str = "stop") -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "smollm2-135m-instruct",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
